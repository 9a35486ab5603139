/* Tensor records, handles, scopes, host transfers, assign, randomness state. */
#include <stdlib.h>
#include <string.h>

#include "eager.h"

/* ------------------------------------------------------------ scopes (per thread) */
/* A thread's scope stack is part of its state (eager.h): its lists go when
 * the thread exits; the handles themselves stay in the runtime until
 * released or shutdown. */
typedef ctpu_scope scope_t;

/* An item no longer in the scope (released, or kept one level out) never
 * comes back to it. When the list is full these go first, so scope_end walks
 * about the handles still in the scope, not every handle the step made; it
 * grows only when half of it is still in the scope (each compaction is paid
 * by as many pushes). */
static void scope_compact(scope_t *s)
{
    ctpu_trec *const *pages = ctpu_rt->pages;
    uint64_t *items = s->items, sid = s->id;
    size_t k = 0;
    for (size_t i = 0, n = s->n; i < n; i++) {
        ctpu_trec *r = ctpu_slot_if_live(pages, items[i]);
        if (r && r->scope_id == sid) items[k++] = items[i];
    }
    s->n = k;
}

static bool scope_push_item(scope_t *s, uint64_t id)
{
    if (s->n == s->cap) {
        if (s->cap) scope_compact(s);
        if (!s->cap || s->n * 2 > s->cap) {
            size_t nc = s->cap ? s->cap * 2 : 64;
            uint64_t *p = realloc(s->items, nc * sizeof *p);
            if (p) {
                s->items = p;
                s->cap = nc;
            } else if (s->n == s->cap) {
                return false;
            }
        }
    }
    s->items[s->n++] = id;
    return true;
}

/* ------------------------------------------------------------ records */
/* Slots: a runtime-wide free list under slot_mu, and in front of it each
 * thread's stash of free slots (its state, eager.h), so making and
 * releasing a handle takes no lock on most ops: a thread refills half a
 * stash at a time and gives half back when it overflows. A slot freed into
 * a stash is reused by that thread (program order); one crossing threads
 * goes through slot_mu, which orders the reuse as before. */
#define SLOT_BATCH (CTPU_SLOT_STASH / 2)

static bool slot_alloc(ctpu_thread_state *ts, uint32_t *out)
{
    if (ts && ts->slots.n > 0) {
        *out = ts->slots.idx[--ts->slots.n];
        return true;
    }
    ctpu_runtime *rt = ctpu_rt;
    pthread_mutex_lock(&rt->slot_mu);
    if (rt->n_free) {
        if (ts) {   /* this one, and a batch for the next ones (the oldest last, as the list hands them out) */
            uint32_t k = rt->n_free - 1 < SLOT_BATCH ? rt->n_free - 1 : SLOT_BATCH;
            for (uint32_t i = 0; i < k; i++) ts->slots.idx[k - 1 - i] = rt->free_list[rt->n_free - 2 - i];
            *out = rt->free_list[rt->n_free - 1];
            rt->n_free -= k + 1;
            ts->slots.n = (int)k;
        } else {
            *out = rt->free_list[--rt->n_free];
        }
        pthread_mutex_unlock(&rt->slot_mu);
        return true;
    }
    uint32_t n = atomic_load_explicit(&rt->n_slots, memory_order_relaxed);
    if (n == rt->n_pages * CTPU_SLOTS_PER_PAGE) {
        if (rt->n_pages == CTPU_MAX_PAGES) { pthread_mutex_unlock(&rt->slot_mu); return false; }
        ctpu_trec *page = calloc(CTPU_SLOTS_PER_PAGE, sizeof *page);
        if (!page) { pthread_mutex_unlock(&rt->slot_mu); return false; }
        /* generations start at a per-runtime value, so a handle kept across
         * shutdown/init is stale rather than an alias of a new handle */
        uint32_t gen0 = (uint32_t)(rt->epoch * 2654435761u) | 1u;
        for (uint32_t i = 0; i < CTPU_SLOTS_PER_PAGE; i++) page[i].gen = gen0;
        rt->pages[rt->n_pages++] = page;
    }
    /* readers check handles against n_slots without the lock: publish the
     * new page (and the slot) before the count */
    *out = n;
    atomic_store_explicit(&rt->n_slots, n + 1, memory_order_release);
    pthread_mutex_unlock(&rt->slot_mu);
    return true;
}

/* Onto the global list (slot_mu held). False: no memory for the list (the slot leaks, never reused). */
static bool slot_push_locked(ctpu_runtime *rt, uint32_t idx)
{
    if (rt->n_free == rt->free_cap) {
        uint32_t nc = rt->free_cap ? rt->free_cap * 2 : 1024;
        uint32_t *p = realloc(rt->free_list, nc * sizeof *p);
        if (!p) return false;
        rt->free_list = p;
        rt->free_cap = nc;
    }
    rt->free_list[rt->n_free++] = idx;
    return true;
}

static void slot_free(uint32_t idx)
{
    ctpu_thread_state *ts = ctpu_ts_current();   /* none (or another runtime's): the global list */
    if (ts && ts->slots.n < CTPU_SLOT_STASH) {
        ts->slots.idx[ts->slots.n++] = idx;
        return;
    }
    ctpu_runtime *rt = ctpu_rt;
    pthread_mutex_lock(&rt->slot_mu);
    if (ts) {   /* the stash is full: its older half goes back, this one stays */
        for (int i = 0; i < SLOT_BATCH; i++) slot_push_locked(rt, ts->slots.idx[i]);
        memmove(ts->slots.idx, ts->slots.idx + SLOT_BATCH, sizeof(uint32_t) * (CTPU_SLOT_STASH - SLOT_BATCH));
        ts->slots.n = CTPU_SLOT_STASH - SLOT_BATCH;
        ts->slots.idx[ts->slots.n++] = idx;
    } else {
        slot_push_locked(rt, idx);
    }
    pthread_mutex_unlock(&rt->slot_mu);
}

void ctpu__slots_drop(ctpu_thread_state *s, ctpu_runtime *rt)
{
    if (rt && s->slots.n > 0) {
        pthread_mutex_lock(&rt->slot_mu);
        for (int i = 0; i < s->slots.n; i++) slot_push_locked(rt, s->slots.idx[i]);
        pthread_mutex_unlock(&rt->slot_mu);
    }
    s->slots.n = 0;
}

ctpu_trec *ctpu_rec_get(ctpu_tensor t, const char *op, const char *arg, bool quiet_null)
{
    if (!ctpu_check_init(op)) return NULL;
    if (ctpu_is_null(t)) {
        if (t.id != 0) {
            ctpu__fail_from(t, op, arg, quiet_null);
        } else {
            /* CTPU_NULL itself is an error in every call, ops included: a new
             * failure (and error handle) naming op and arg. (An error handle
             * is passed along above, its first cause kept.) */
            if (ctpu__ts->fail_handle != 0) ctpu__ts_get()->fail_handle = 0;
            ctpu_set_error(CTPU_ERR_NULL_HANDLE, "%s: %s is a null handle (CTPU_NULL)", op, arg);
        }
        return NULL;
    }
    uint32_t idx = ctpu_handle_slot(t);
    if (idx >= atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire)) {
        ctpu_set_error(CTPU_ERR_STALE_HANDLE, "%s: %s is not a handle of this runtime (id %#llx)", op,
                       arg, (unsigned long long)t.id);
        return NULL;
    }
    ctpu_trec *r = ctpu_slot(idx);
    if (!r->live || r->gen != ctpu_handle_gen(t)) {
        ctpu_set_error(CTPU_ERR_STALE_HANDLE,
                       "%s: %s is a released (stale) handle: its scope ended or it was released", op, arg);
        return NULL;
    }
    return r;
}

ctpu_tensor ctpu_handle_new(const ctpu_vtype *type, ctpu_buffer *buf, size_t off, const char *op)
{
    ctpu_thread_state *ts = ctpu_ts();   /* out of host memory: global, as below */
    uint32_t idx;
    if (!slot_alloc(ts, &idx)) {
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of tensor handles", op);
        if (buf) ctpu_buffer_release(ctpu_rt->dev, buf);
        return ctpu_failed();
    }
    ctpu_trec *r = ctpu_slot(idx);
    atomic_store_explicit(&r->live, true, memory_order_relaxed);
    r->type = *type;
    r->buf = buf;
    r->off = off;
    r->ag = NULL;
    r->trace_id = 0;
    r->tval = -1;
    r->leaf_grad = false;
    r->name = NULL;
    r->dyn = NULL;
    r->made_by = NULL;
    r->origin = ts && ts->label.call_name ? ts->label.call_name : op;   /* the leak watch names the user's call */
    r->origin_label = ts && ts->label.depth ? ts->label.stack[ts->label.depth - 1] : 0;
    if (buf) {
        ctpu_buffer_bind_touch(buf);
        /* refs 1: the caller's reference (this handle's now) is the only
         * one, so no other thread can touch handle_refs (0): a plain store,
         * not a locked add (a fresh op output, on every strict op) */
        if (atomic_load_explicit(&buf->refs, memory_order_relaxed) == 1)
            atomic_store_explicit(&buf->handle_refs, 1, memory_order_relaxed);
        else
            atomic_fetch_add(&buf->handle_refs, 1);
    }
    ctpu_tensor t = { ((uint64_t)atomic_load_explicit(&r->gen, memory_order_relaxed) << 32) | (idx + 1) };
    if (ts && ts->scope_depth > 0) {
        scope_t *s = &ts->scopes[ts->scope_depth - 1];
        r->scope_id = s->id;
        if (!scope_push_item(s, t.id)) r->scope_id = 0; /* falls back to global */
    } else {
        r->scope_id = 0;
    }
    return t;
}

ctpu_tensor ctpu_handle_view(ctpu_trec *rec, const ctpu_vtype *type, size_t off, const char *op)
{
    if (ctpu_rec_pending(rec)) {
        /* another handle on a value not computed yet (same type only) */
        CTPU_ASSERT(type->ndim == rec->type.ndim && type->dtype == rec->type.dtype);
        return ctpu__defer_alias_handle(rec, op);
    }
    ctpu_buffer_retain(rec->buf);
    return ctpu_handle_new(type, rec->buf, off, op);
}

void ctpu_handle_release_rec(ctpu_trec *r, uint32_t idx)
{
    ctpu_buffer *b = r->buf;
    if (r->ag) ctpu__ag_release(r);
    atomic_store_explicit(&r->live, false, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&r->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&r->gen, g ? g : 1, memory_order_relaxed);
    r->buf = NULL;
    if (r->name) {
        free(r->name);
        r->name = NULL;
    }
    if (r->dyn) {
        free(r->dyn);
        r->dyn = NULL;
    }
    if (b) {
        ctpu_buffer_bind_touch(b);
        /* refs 1: this handle's reference is the only one (see
         * ctpu_handle_new): a plain store, not a locked subtract */
        if (atomic_load_explicit(&b->refs, memory_order_relaxed) == 1)
            atomic_store_explicit(&b->handle_refs, 0, memory_order_relaxed);
        else
            atomic_fetch_sub(&b->handle_refs, 1);
        ctpu_buffer_release(ctpu_rt->dev, b);
    }
    slot_free(idx);
}

ctpu_status ctpu_release(ctpu_tensor t)
{
    ctpu_trec *r = ctpu_rec_get(t, "release", "t", false);
    if (!r) return ctpu_last_status();
    if (r->leaf_grad) {
        /* PyTorch has no way to free a .grad behind its leaf's back either:
         * w.grad = None is zero_grad(set_to_none) */
        ctpu_set_error(CTPU_ERR_STATE, "release: t is the .grad of a leaf (from ctpu_grad), owned by the leaf: "
                       "drop it with ctpu_zero_grad(leaf)");
        return CTPU_ERR_STATE;
    }
    if (!ctpu__capture_note_release(r)) return ctpu_last_status();   /* fullgraph: not released */
    ctpu_handle_release_rec(r, ctpu_handle_slot(t));
    return CTPU_OK;
}

void ctpu__name_buffer(const ctpu_trec *r, ctpu_buffer *b)
{
    if (!r->name || !b || (b->name && strcmp(b->name, r->name) == 0)) return;
    char *n = strdup(r->name);
    if (!n) return;                      /* a name is a courtesy: out of memory keeps the old one */
    free(b->name);
    b->name = n;
}

ctpu_status ctpu_set_name(ctpu_tensor t, const char *name)
{
    ctpu_trec *r = ctpu_rec_get(t, "set_name", "t", false);
    if (!r) return ctpu_last_status();
    size_t n = name ? strlen(name) : 0;
    if (n > CTPU_NAME_MAX) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "set_name: the name has %zu bytes (at most %d)", n, CTPU_NAME_MAX);
        return CTPU_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) {
            ctpu_set_error(CTPU_ERR_INVALID_ARG, "set_name: the name has a control character at byte %zu", i);
            return CTPU_ERR_INVALID_ARG;
        }
    char *copy = n ? strdup(name) : NULL;
    if (n && !copy) {
        ctpu_set_error(CTPU_ERR_OOM, "set_name: out of host memory");
        return CTPU_ERR_OOM;
    }
    free(r->name);
    r->name = copy;
    if (r->buf) {
        if (copy) ctpu__name_buffer(r, r->buf);
        else { free(r->buf->name); r->buf->name = NULL; }
    }
    return CTPU_OK;
}

const char *ctpu_name(ctpu_tensor t)
{
    if (!ctpu_is_valid(t)) return "";
    return ctpu_rec_name(ctpu_slot(ctpu_handle_slot(t)));
}

bool ctpu_is_valid(ctpu_tensor t)
{
    if (!ctpu_rt || t.id == 0) return false;
    uint32_t idx = ctpu_handle_slot(t);
    if (idx >= atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire)) return false;
    ctpu_trec *r = ctpu_slot(idx);
    return r->live && r->gen == ctpu_handle_gen(t);
}

void ctpu__tensors_shutdown(ctpu_runtime *rt)
{
    uint32_t n_slots = atomic_load(&rt->n_slots);
    for (uint32_t i = 0; i < n_slots; i++) {
        ctpu_trec *r = &rt->pages[i / CTPU_SLOTS_PER_PAGE][i % CTPU_SLOTS_PER_PAGE];
        if (r->live) ctpu_handle_release_rec(r, i);
    }
}

/* ------------------------------------------------------------ leak watch */
const char *ctpu__fmt_bytes(uint64_t b, char *buf, size_t len)
{
    if (b >= (1ull << 30)) snprintf(buf, len, "%.1f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
    else if (b >= (1ull << 10)) snprintf(buf, len, "%.1f KiB", (double)b / (1ull << 10));
    else snprintf(buf, len, "%llu bytes", (unsigned long long)b);
    return buf;
}

typedef struct { const ctpu_buffer *buf; const char *op; uint32_t label; } held_t;

static int held_cmp(const void *a, const void *b)
{
    const held_t *x = a, *y = b;
    return x->buf < y->buf ? -1 : x->buf > y->buf;
}

static int holder_cmp(const void *a, const void *b)
{
    const ctpu_holder *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    if (x->handles != y->handles) return x->handles < y->handles ? 1 : -1;
    int c = strcmp(x->op, y->op);
    return c ? c : (x->label > y->label) - (x->label < y->label);
}

/* The holder row of op in label (origins are static strings: compared by value). */
static ctpu_holder *holder_of(ctpu_holder *h, size_t *n, size_t cap, const char *op, uint32_t label)
{
    for (size_t i = 0; i < *n; i++)
        if (h[i].label == label && (h[i].op == op || strcmp(h[i].op, op) == 0)) return &h[i];
    if (*n == cap) return &h[cap - 1];          /* the last row gathers the rest */
    h[*n] = (ctpu_holder){ .op = op, .label = label };
    return &h[(*n)++];
}

const char *ctpu__holder_name(const ctpu_holder *h, char *buf, size_t len)
{
    const char *l = ctpu__label_text(h->label);
    snprintf(buf, len, "%s%s%.80s%s", h->op, l[0] ? " (\"" : "", l, l[0] ? "\")" : "");
    return buf;
}

size_t ctpu__live_holders(ctpu_runtime *rt, uint64_t *handles, uint64_t *bytes, ctpu_holder *top, size_t max)
{
    enum { ROWS = 64 };
    ctpu_holder rows[ROWS];
    size_t nr = 0, nh = 0;
    uint32_t n_slots = atomic_load(&rt->n_slots);
    held_t *held = malloc(sizeof *held * ((size_t)n_slots + 1));
    *handles = *bytes = 0;
    for (uint32_t i = 0; i < n_slots; i++) {
        const ctpu_trec *r = &rt->pages[i / CTPU_SLOTS_PER_PAGE][i % CTPU_SLOTS_PER_PAGE];
        if (!atomic_load_explicit(&r->live, memory_order_relaxed)) continue;
        const char *op = r->origin ? r->origin : "?";
        (*handles)++;
        holder_of(rows, &nr, ROWS, op, r->origin_label)->handles++;
        if (held && r->buf) held[nh++] = (held_t){ r->buf, op, r->origin_label };
    }
    if (held) {
        qsort(held, nh, sizeof *held, held_cmp);
        for (size_t i = 0; i < nh; i++) {
            if (i && held[i].buf == held[i - 1].buf) continue;   /* views share their storage */
            uint64_t b = held[i].buf->bytes < 64 ? 64 : (held[i].buf->bytes + 63) & ~(uint64_t)63;
            *bytes += b;
            holder_of(rows, &nr, ROWS, held[i].op, held[i].label)->bytes += b;
        }
        free(held);
    }
    qsort(rows, nr, sizeof *rows, holder_cmp);
    size_t n = nr < max ? nr : max;
    memcpy(top, rows, n * sizeof *top);
    return n;
}

/* ------------------------------------------------------------ queries */
int ctpu_ndim(ctpu_tensor t)
{
    ctpu_trec *r = ctpu_rec_get(t, "ndim", "t", false);
    return r ? r->type.ndim : -1;
}

int64_t ctpu_dim(ctpu_tensor t, int d)
{
    ctpu_trec *r = ctpu_rec_get(t, "dim", "t", false);
    if (!r) return -1;
    int nd = r->type.ndim;
    if (d < -nd || d >= nd) {
        char b[128];
        ctpu_set_error(CTPU_ERR_SHAPE, "dim: d=%d is out of range for t %s", d, ctpu_fmt_type(&r->type, b, sizeof b));
        return -1;
    }
    return r->type.shape[d < 0 ? d + nd : d];
}

int64_t ctpu_numel(ctpu_tensor t)
{
    ctpu_trec *r = ctpu_rec_get(t, "numel", "t", false);
    return r ? ctpu_vtype_numel(&r->type) : -1;
}

ctpu_dtype ctpu_dtype_of(ctpu_tensor t)
{
    ctpu_trec *r = ctpu_rec_get(t, "dtype_of", "t", false);
    return r ? (ctpu_dtype)r->type.dtype : CTPU_DTYPE_COUNT;
}

ctpu_status ctpu_shape(ctpu_tensor t, int64_t out[CTPU_MAX_DIMS], int *ndim)
{
    ctpu_trec *r = ctpu_rec_get(t, "shape", "t", false);
    if (!r) return ctpu_last_status();
    if (!out || !ndim) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "shape: %s is NULL", out ? "ndim" : "out");
        return CTPU_ERR_INVALID_ARG;
    }
    memcpy(out, r->type.shape, sizeof(int64_t) * r->type.ndim);
    *ndim = r->type.ndim;
    return CTPU_OK;
}

/* ------------------------------------------------------------ scopes */
static ctpu_status scope_begin(bool step, const char *op)
{
    if (!ctpu_check_init(op)) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory", op);
        return CTPU_ERR_OOM;
    }
    if (ts->scope_depth == CTPU_MAX_SCOPES) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: scopes nest at most %d deep; likely cause: a missing ctpu_scope_end "
                       "(every ctpu_scope_begin needs one, on error paths too)", op, CTPU_MAX_SCOPES);
        return CTPU_ERR_STATE;
    }
    scope_t *s = &ts->scopes[ts->scope_depth++];
    s->id = atomic_fetch_add(&ctpu_rt->next_scope_id, 1);
    s->n = 0;
    s->step = step;
    /* the program marks its steps: the loop detector (auto) stops before
     * the first step's ops, not at its end */
    if (step) atomic_store(&ctpu_rt->user_marks_steps, true);
    return CTPU_OK;
}

static ctpu_status mark_step_as(const char *op);

/* End ts's innermost scope: release its handles (kept ones moved out already). */
static void scope_release(ctpu_thread_state *ts)
{
    scope_t *s = &ts->scopes[ts->scope_depth - 1];
    ctpu_trec *const *pages = ctpu_rt->pages;
    const uint64_t *items = s->items, sid = s->id;
    for (size_t i = 0, n = s->n; i < n; i++) {
        ctpu_trec *r = ctpu_slot_if_live(pages, items[i]);
        if (r && r->scope_id == sid) ctpu_handle_release_rec(r, ctpu_handle_slot((ctpu_tensor){ items[i] }));
    }
    s->n = 0;
    ts->scope_depth--;
}

static ctpu_status scope_end(bool step, const char *op)
{
    if (!ctpu_check_init(op)) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *ts = ctpu_ts_current();
    if (ts && ctpu__user_underflow(ts, ts->scope_depth, ts->user.scope, op, step ? "step scope" : "scope",
                                   step ? "ctpu_step_begin" : "ctpu_scope_begin"))
        return CTPU_ERR_STATE;
    if (!ts || ts->scope_depth == 0) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: no scope is open", op);
        return CTPU_ERR_STATE;
    }
    scope_t *s = &ts->scopes[ts->scope_depth - 1];
    if (s->step != step) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: the innermost open scope is a %s scope", op,
                       s->step ? "step" : "plain");
        return CTPU_ERR_STATE;
    }
    scope_release(ts);   /* release first: at a step's end only kept values are live-out */
    if (step) return mark_step_as(op);
    return CTPU_OK;
}

int ctpu__scopes_unwind(ctpu_thread_state *ts, int depth)
{
    int n = 0;
    for (; ts->scope_depth > depth; n++) scope_release(ts);
    return n;
}

ctpu_status ctpu_scope_begin(void) { return scope_begin(false, "scope_begin"); }
ctpu_status ctpu_scope_end(void) { return scope_end(false, "scope_end"); }
ctpu_status ctpu_step_begin(void) { return scope_begin(true, "step_begin"); }
ctpu_status ctpu_step_end(void) { return scope_end(true, "step_end"); }

ctpu_status ctpu_mark_step(void) { return mark_step_as("mark_step"); }

/* mark_step, or step_end's: inside a compiled step's capture a graph break,
 * checked before anything is cut or counted (fullgraph: the error, and
 * nothing of the step ran) */
static ctpu_status mark_step_as(const char *op)
{
    if (!ctpu_check_init(op)) return CTPU_ERR_NOT_INITIALIZED;
    if (ctpu__capturing()) {
        char what[48];
        snprintf(what, sizeof what, "a trace cut (%s)", op);
        if (!ctpu__capture_break(CTPU_CUT_MARK_STEP, what)) return ctpu_last_status();
    }
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_MARKED_STEPS, 1);
    atomic_store(&ctpu_rt->user_marks_steps, true);
    ctpu_status st = ctpu__defer_flush(CTPU_CUT_MARK_STEP);
    ctpu_thread_state *ts = ctpu_ts_current();
    if (ts) ts->label.op_no = 0;   /* ops are numbered within a step */
    atomic_fetch_add(&ctpu_rt->marked_steps, 1);
    ctpu__report_step();   /* report.c: per-step history */
    return st;
}

ctpu_tensor ctpu_keep(ctpu_tensor t)
{
    /* (keep(CTPU_NULL) is an error as any call's: CTPU_ERR_NULL_HANDLE, "keep: t is a null handle") */
    ctpu_trec *r = ctpu_rec_get(t, "keep", "t", true);
    if (!r) return ctpu_failed();
    ctpu_thread_state *ts = ctpu_ts_current();   /* none: no scope is open */
    /* find the scope the handle is in now, move it one level out */
    int level = -1, depth = ts ? ts->scope_depth : 0;
    for (int i = depth - 1; i >= 0; i--)
        if (ts->scopes[i].id == r->scope_id) { level = i; break; }
    if (level <= 0) { r->scope_id = 0; return t; }     /* to global */
    scope_t *parent = &ts->scopes[level - 1];
    if (!scope_push_item(parent, t.id)) {
        ctpu_set_error(CTPU_ERR_OOM, "keep: out of host memory");
        return ctpu_failed();
    }
    r->scope_id = parent->id;
    return t;
}

/* ------------------------------------------------------------ host transfers */
/* The first dim of a shape that breaks the element cap: a negative extent,
 * an extent above CTPU_NUMEL_CAP, or the dim at which the product of the
 * nonzero extents passes it (a zero extent does not hide a huge one: a
 * reduction over the zero dim would give the huge one a buffer sized by a
 * wrapped product); -1 when the shape is within it. */
static int shape_bad_dim(int ndim, const int64_t *shape)
{
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        int64_t x = shape[d];
        if (x < 0 || x > CTPU_NUMEL_CAP) return d;
        if (x == 0) continue;
        if (n > (uint64_t)CTPU_NUMEL_CAP / (uint64_t)x) return d;
        n *= (uint64_t)x;
    }
    return -1;
}

bool ctpu__type_ok(const char *op, const char *what, const ctpu_vtype *t)
{
    int bad = shape_bad_dim(t->ndim, t->shape);
    if (__builtin_expect(bad < 0, 1)) return true;
    char tb[160];
    ctpu_set_error(CTPU_ERR_SHAPE, "%s: %s would be %s: dim %d (%lld) %s the 2^56 element cap", op, what,
                   ctpu_fmt_type(t, tb, sizeof tb), bad, (long long)t->shape[bad],
                   t->shape[bad] < 0 ? "is negative, outside" : t->shape[bad] > CTPU_NUMEL_CAP ? "exceeds" : "takes the element count past");
    return false;
}

static bool validate_shape(const char *op, int ndim, const int64_t *shape, ctpu_dtype dt, ctpu_vtype *out)
{
    if ((unsigned)dt >= CTPU_DTYPE_COUNT) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: dtype %d is not a ctpu_dtype", op, (int)dt);
        return false;
    }
    if (ndim < 0 || ndim > CTPU_MAX_DIMS) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: ndim=%d is outside [0, %d]", op, ndim, CTPU_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: shape is NULL with ndim=%d", op, ndim);
        return false;
    }
    int bad = shape_bad_dim(ndim, shape);
    if (bad >= 0) {
        if (shape[bad] < 0)
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: shape[%d]=%lld is negative", op, bad, (long long)shape[bad]);
        else
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: shape[%d]=%lld: %s exceeds the 2^56 element cap", op, bad,
                           (long long)shape[bad], shape[bad] > CTPU_NUMEL_CAP ? "the extent" : "the element count");
        return false;
    }
    out->dtype = (uint8_t)dt;
    out->ndim = (uint8_t)ndim;
    memset(out->shape, 0, sizeof out->shape);
    if (ndim) memcpy(out->shape, shape, sizeof(int64_t) * (size_t)ndim);
    return true;
}

bool ctpu__validate_shape(const char *op, int ndim, const int64_t *shape, ctpu_dtype dt, ctpu_vtype *out)
{
    return validate_shape(op, ndim, shape, dt, out);
}

/* from_host's body; f32_as_bf16: data is float, rounded to bf16 on the way
 * (the one rounding function, as ctpu_cast does). */
static ctpu_tensor from_host_impl(const char *op, const void *data, ctpu_dtype dt, int ndim, const int64_t *shape,
                                  bool f32_as_bf16)
{
    if (!ctpu_check_init(op)) return ctpu_failed();
    ctpu_vtype vt;
    if (!validate_shape(op, ndim, shape, dt, &vt)) return ctpu_failed();
    size_t bytes = (size_t)ctpu_vtype_numel(&vt) * ctpu_kdt_size(dt);
    if (!data && bytes) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: data is NULL for %zu bytes", op, bytes);
        return ctpu_failed();
    }
    char err[256];
    ctpu_buffer *b = ctpu_buffer_alloc(ctpu_rt->dev, bytes, err, sizeof err);
    if (!b) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_OOM, "%s: %s: %s", op, ctpu_fmt_type(&vt, tb, sizeof tb), err);
        return ctpu_failed();
    }
    if (f32_as_bf16) {
        const float *src = data;
        uint16_t *dst = b->data;
        for (int64_t i = 0, n = ctpu_vtype_numel(&vt); i < n; i++) dst[i] = ctpu_f32_to_bf16(src[i]);
    } else if (bytes) {
        memcpy(b->data, data, bytes);
    }
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_H2D_BYTES, (long long)(f32_as_bf16 ? bytes * 2 : bytes));
    return ctpu_handle_new(&vt, b, 0, op);
}

ctpu_tensor ctpu_from_host(const void *data, ctpu_dtype dt, int ndim, const int64_t *shape)
{
    return ctpu__declared_dynamic(from_host_impl("from_host", data, dt, ndim, shape, false), dt, ndim, shape);
}

ctpu_tensor ctpu_from_host_f32_as_bf16(const float *data, int ndim, const int64_t *shape)
{
    return ctpu__declared_dynamic(from_host_impl("from_host_f32_as_bf16", data, CTPU_BF16, ndim, shape, true),
                                  CTPU_BF16, ndim, shape);
}

/* to_host's body. as_f32: dst is float[numel] whatever t's dtype (bf16
 * widened exactly, i32 converted as (float)). */
static ctpu_status to_host_run(const char *op, ctpu_tensor t, void *dst, size_t dst_bytes, bool as_f32);

/* A host read: a guarded call (it waits for the device; ctpu_shutdown on
 * another thread is refused meanwhile). */
static ctpu_status to_host_impl(const char *op, ctpu_tensor t, void *dst, size_t dst_bytes, bool as_f32)
{
    if (!ctpu__call_enter(op)) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_status st = to_host_run(op, t, dst, dst_bytes, as_f32);
    ctpu__call_exit();
    return st;
}

static ctpu_status to_host_run(const char *op, ctpu_tensor t, void *dst, size_t dst_bytes, bool as_f32)
{
    ctpu_trec *r = ctpu_rec_get(t, op, "t", false);
    if (!r) return ctpu_last_status();
    int64_t numel = ctpu_vtype_numel(&r->type);
    size_t bytes = (size_t)numel * ctpu_kdt_size(r->type.dtype);
    size_t need = as_f32 ? (size_t)numel * sizeof(float) : bytes;
    char tb[128];
    if (!dst && need) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: dst is NULL for t %s", op, ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_INVALID_ARG;
    }
    if (dst_bytes < need) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: dst_bytes=%zu is less than the %zu bytes %sof t %s", op, dst_bytes,
                       need, as_f32 ? "(as f32) " : "", ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_INVALID_ARG;
    }
    if (ctpu__capturing()) {           /* a host read inside a compiled step: a graph break */
        char what[128];
        const char *nm = ctpu_rec_name(r);
        snprintf(what, sizeof what, "host read (%s) of %.48s", op, nm[0] ? nm : ctpu_fmt_type(&r->type, tb, sizeof tb));
        if (!ctpu__capture_break(CTPU_CUT_HOST_READ, what)) return ctpu_last_status();
    }
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_HOST_READS, 1);
    ctpu_op_prov pv = ctpu_prov_next();                /* host reads are numbered as ops */
    ctpu__report_host_read(bytes, ctpu_rec_name(r));   /* report.c: reads by call-site label */
    if (!ctpu__materialize(r, op, CTPU_CUT_HOST_READ)) return ctpu_last_status();
    ctpu_device_wait(ctpu_rt->dev, 0);
    unsigned f = atomic_load(&r->buf->fault);
    if (f) {
        const ctpu_fault_rec *fr = ctpu_device_fault(ctpu_rt->dev, f);
        char where[160];
        const char *nm = ctpu_rec_name(r);   /* the tensor read, when it has a name */
        ctpu_set_error(fr->status, "%s%s%s%s, raised at %s%s", fr->msg, nm[0] ? " (t is " : "", nm, nm[0] ? ")" : "", op,
                       ctpu_device_prov_str(ctpu_rt->dev, pv, where, sizeof where));
        ctpu_device_take_error(ctpu_rt->dev, NULL, 0); /* reported here */
        return fr->status;
    }
    const char *src = (const char *)r->buf->data + r->off;
    if (!as_f32 || r->type.dtype == CTPU_F32) {
        if (bytes) memcpy(dst, src, bytes);
    } else if (r->type.dtype == CTPU_BF16) {
        const uint16_t *h = (const uint16_t *)(const void *)src;
        float *o = dst;
        for (int64_t i = 0; i < numel; i++) o[i] = ctpu_bf16_to_f32(h[i]);
    } else {
        const int32_t *v = (const int32_t *)(const void *)src;
        float *o = dst;
        for (int64_t i = 0; i < numel; i++) o[i] = (float)v[i];
    }
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_D2H_BYTES, (long long)bytes);
    return CTPU_OK;
}

ctpu_status ctpu_to_host(ctpu_tensor t, void *dst, size_t dst_bytes)
{
    return to_host_impl("to_host", t, dst, dst_bytes, false);
}

ctpu_status ctpu_to_host_as_f32(ctpu_tensor t, float *dst, size_t dst_bytes)
{
    return to_host_impl("to_host_as_f32", t, dst, dst_bytes, true);
}

ctpu_status ctpu__to_host_op(const char *op, ctpu_tensor t, void *dst, size_t dst_bytes)
{
    return to_host_impl(op, t, dst, dst_bytes, false);
}

ctpu_status ctpu_item(ctpu_tensor t, double *out)
{
    ctpu_trec *r = ctpu_rec_get(t, "item", "t", false);
    if (!r) return ctpu_last_status();
    char tb[128];
    if (!out) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "item: out is NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    if (ctpu_vtype_numel(&r->type) != 1) {
        ctpu_set_error(CTPU_ERR_SHAPE, "item: t is %s: item needs exactly one element",
                       ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_SHAPE;
    }
    union { float f; uint16_t h; int32_t i; } v;
    ctpu_status st = to_host_impl("item", t, &v, sizeof v, false);
    if (st != CTPU_OK) return st;
    *out = r->type.dtype == CTPU_F32 ? (double)v.f : r->type.dtype == CTPU_BF16 ? (double)ctpu_bf16_to_f32(v.h) : (double)v.i;
    return CTPU_OK;
}

/* ------------------------------------------------------------ assign */
/* strict and debug eager: the write (in place, or copy-on-write) */
static ctpu_status assign_eager(ctpu_trec *d, ctpu_trec *s, ctpu_op_prov prov)
{
    if (!ctpu__materialize(d, "assign", CTPU_CUT_MODE) || !ctpu__materialize(s, "assign", CTPU_CUT_MODE))
        return ctpu_last_status();
    if (d->buf == s->buf && d->off == s->off) return CTPU_OK;
    char ta[128];
    ctpu_node node = { .op = CTPU_OP_COPY, .n_in = 1, .out = d->type };
    ctpu_trec *in[1] = { s };
    if (atomic_load(&d->buf->handle_refs) == 1 && atomic_load(&d->buf->trace_readers) == 0) {
        /* in place: the stream is in order, reads already enqueued see the old value (and no
         * other thread's pending trace reads it: that trace runs later, it keeps the old buffer) */
        ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_ASSIGN_IN_PLACE, 1);
        return ctpu_dispatch_into(&node, in, NULL, d->buf, d->off, prov);
    }
    /* copy-on-write: dst gets a buffer of its own */
    size_t bytes = (size_t)ctpu_vtype_numel(&d->type) * ctpu_kdt_size(d->type.dtype);
    char err[256];
    ctpu_buffer *nb = ctpu_buffer_alloc(ctpu_rt->dev, bytes, err, sizeof err);
    if (!nb) {
        ctpu_set_error(CTPU_ERR_OOM, "assign: dst %s: %s", ctpu_fmt_type(&d->type, ta, sizeof ta), err);
        return CTPU_ERR_OOM;
    }
    ctpu_status st = ctpu_dispatch_into(&node, in, NULL, nb, 0, prov);
    if (st != CTPU_OK) { ctpu_buffer_release(ctpu_rt->dev, nb); return st; }
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_ASSIGN_COPY, 1);
    ctpu_buffer *old = d->buf;
    ctpu_buffer_bind_touch(old);
    atomic_fetch_add(&nb->handle_refs, 1);
    d->buf = nb;
    d->off = 0;
    atomic_fetch_sub(&old->handle_refs, 1);
    ctpu_buffer_release(ctpu_rt->dev, old);
    return CTPU_OK;
}

ctpu_status ctpu_assign(ctpu_tensor dst, ctpu_tensor src)
{
    ctpu_trec *d = ctpu_rec_get(dst, "assign", "dst", false);
    if (!d) return ctpu_last_status();
    ctpu_trec *s = ctpu_rec_get(src, "assign", "src", false);
    if (!s) return ctpu_last_status();
    char ta[128], tb[128];
    if (d->type.dtype != s->type.dtype) {
        ctpu_set_error(CTPU_ERR_DTYPE, "assign: dst is %s, src is %s: dtypes differ",
                       ctpu_fmt_type(&d->type, ta, sizeof ta), ctpu_fmt_type(&s->type, tb, sizeof tb));
        return CTPU_ERR_DTYPE;
    }
    bool same = d->type.ndim == s->type.ndim;
    for (int i = 0; same && i < d->type.ndim; i++) same = d->type.shape[i] == s->type.shape[i];
    if (!same) {
        ctpu_set_error(CTPU_ERR_SHAPE, "assign: dst is %s, src is %s: shapes differ",
                       ctpu_fmt_type(&d->type, ta, sizeof ta), ctpu_fmt_type(&s->type, tb, sizeof tb));
        return CTPU_ERR_SHAPE;
    }
    ctpu_status st = ctpu__ag_assign_check(d);
    if (st != CTPU_OK) return st;
    if (ctpu__capturing() && ctpu__ag_assign_records(d, s) && !ctpu__capture_note_history(d)) return ctpu_last_status();
    ctpu_op_prov prov = ctpu_prov_next();
    st = ctpu_mode_now() == CTPU_MODE_DEFER_FUSE ? ctpu__defer_assign(d, dst, s, prov) : assign_eager(d, s, prov);
    if (st == CTPU_OK) ctpu__ag_assign(dst, src);
    return st;
}

/* ------------------------------------------------------------ randomness */
void ctpu_manual_seed(uint64_t seed)
{
    if (!ctpu_rt) return;
    if (!ctpu__capture_host_effect("manual_seed (the generator's state is host state)")) return;   /* fullgraph */
    pthread_mutex_lock(&ctpu_rt->rng_mu);
    ctpu_rt->rng_seed = seed;
    ctpu_rt->rng_offset = 0;
    pthread_mutex_unlock(&ctpu_rt->rng_mu);
}

ctpu_status ctpu_rng_get_state(uint64_t *seed, uint64_t *offset)
{
    if (!ctpu_check_init("rng_get_state")) return CTPU_ERR_NOT_INITIALIZED;
    if (!seed || !offset) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "rng_get_state: %s is NULL", seed ? "offset" : "seed");
        return CTPU_ERR_INVALID_ARG;
    }
    if (!ctpu__capture_host_effect("rng_get_state (a host read of the generator's state)")) return ctpu_last_status();
    ctpu__rng_state(seed, offset);
    return CTPU_OK;
}

void ctpu__rng_state(uint64_t *seed, uint64_t *offset)
{
    pthread_mutex_lock(&ctpu_rt->rng_mu);
    *seed = ctpu_rt->rng_seed;
    *offset = ctpu_rt->rng_offset;
    pthread_mutex_unlock(&ctpu_rt->rng_mu);
}

void ctpu__rng_restore(uint64_t seed, uint64_t offset)
{
    pthread_mutex_lock(&ctpu_rt->rng_mu);
    ctpu_rt->rng_seed = seed;
    ctpu_rt->rng_offset = offset;
    pthread_mutex_unlock(&ctpu_rt->rng_mu);
}

ctpu_status ctpu_rng_set_state(uint64_t seed, uint64_t offset)
{
    if (!ctpu_check_init("rng_set_state")) return CTPU_ERR_NOT_INITIALIZED;
    if (!ctpu__capture_host_effect("rng_set_state (the generator's state is host state)")) return ctpu_last_status();
    ctpu__rng_restore(seed, offset);
    return CTPU_OK;
}

void ctpu__rng_take(uint64_t n, uint64_t *seed, uint64_t *offset)
{
    pthread_mutex_lock(&ctpu_rt->rng_mu);
    *seed = ctpu_rt->rng_seed;
    *offset = ctpu_rt->rng_offset;
    ctpu_rt->rng_offset += n;
    pthread_mutex_unlock(&ctpu_rt->rng_mu);
    /* a compiled step's replay draws again: every op that draws, not only
     * the ones a kind of node names (SDPA's dropout was missed, issue: a
     * replay reused the capture's mask and left the generator behind) */
    if (ctpu__capturing()) ctpu__capture_note_take(n, *seed, *offset);
}
