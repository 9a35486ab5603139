/* Trace Event Format writer (see tracefile.h). Events are fixed-size records
 * in one array allocated at creation; a full buffer drops and counts. */
#include "tracefile.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

typedef struct {
    uint64_t ts, dur;       /* ns since the buffer's origin */
    uint32_t tid;
    uint8_t track;
    char ph;
    char cat[16];
    char name[72];
    char args[224];
} trace_ev;

struct ctpu_tracebuf {
    pthread_mutex_t mu;
    trace_ev *ev;
    size_t n, cap;
    uint64_t dropped;
    uint64_t origin;
    uint32_t tid_max;
};

/* Host threads get small ids in order of their first event. */
static atomic_uint next_tid = 1;
static _Thread_local uint32_t t_tid;

ctpu_tracebuf *ctpu_tracebuf_create(size_t cap)
{
    if (cap == 0) cap = 1;
    ctpu_tracebuf *tb = calloc(1, sizeof *tb);
    if (!tb) return NULL;
    tb->ev = malloc(cap * sizeof *tb->ev);
    if (!tb->ev) { free(tb); return NULL; }
    tb->cap = cap;
    tb->origin = ctpu_now_ns();
    pthread_mutex_init(&tb->mu, NULL);
    return tb;
}

void ctpu_tracebuf_destroy(ctpu_tracebuf *tb)
{
    if (!tb) return;
    pthread_mutex_destroy(&tb->mu);
    free(tb->ev);
    free(tb);
}

static void add(ctpu_tracebuf *tb, char ph, int track, const char *cat, const char *name, uint64_t t0,
                uint64_t t1, const char *args)
{
    if (!tb) return;
    if (track == CTPU_TRACK_HOST && t_tid == 0) t_tid = atomic_fetch_add(&next_tid, 1);
    pthread_mutex_lock(&tb->mu);
    if (tb->n == tb->cap) {
        tb->dropped++;
        pthread_mutex_unlock(&tb->mu);
        return;
    }
    trace_ev *e = &tb->ev[tb->n++];
    e->ph = ph;
    e->track = (uint8_t)track;
    e->tid = track == CTPU_TRACK_HOST ? t_tid : 0;
    e->ts = t0 > tb->origin ? t0 - tb->origin : 0;
    e->dur = t1 > t0 ? t1 - t0 : 0;
    snprintf(e->cat, sizeof e->cat, "%s", cat ? cat : "ctpu");
    snprintf(e->name, sizeof e->name, "%s", name ? name : "?");
    snprintf(e->args, sizeof e->args, "%s", args ? args : "");
    /* a truncated args body would be invalid JSON: drop it */
    if (args && strlen(args) >= sizeof e->args) e->args[0] = 0;
    pthread_mutex_unlock(&tb->mu);
}

void ctpu_trace_complete(ctpu_tracebuf *tb, int track, const char *cat, const char *name, uint64_t t0_ns,
                         uint64_t t1_ns, const char *args)
{
    add(tb, 'X', track, cat, name, t0_ns, t1_ns, args);
}

void ctpu_trace_instant(ctpu_tracebuf *tb, int track, const char *cat, const char *name, uint64_t t_ns,
                        const char *args)
{
    add(tb, 'i', track, cat, name, t_ns, t_ns, args);
}

void ctpu_trace_program(ctpu_tracebuf *tb, const char *name, uint64_t program_id, uint64_t seq, int n_steps,
                        uint64_t t0_ns, uint64_t t1_ns, const char *span)
{
    char args[224], nm[72];
    if (program_id) {
        snprintf(args, sizeof args, "\"program\":%llu,\"seq\":%llu,\"kernels\":%d%s", (unsigned long long)program_id,
                 (unsigned long long)seq, n_steps, span ? span : "");
        snprintf(nm, sizeof nm, "program %llu: %.40s", (unsigned long long)program_id, name ? name : "?");
    } else {
        snprintf(args, sizeof args, "\"program\":\"strict\",\"seq\":%llu,\"kernels\":%d%s", (unsigned long long)seq,
                 n_steps, span ? span : "");
        snprintf(nm, sizeof nm, "%.60s", name ? name : "program");
    }
    add(tb, 'X', CTPU_TRACK_DEVICE, "program", nm, t0_ns, t1_ns, args);
}

size_t ctpu_tracebuf_capacity(ctpu_tracebuf *tb) { return tb->cap; }

size_t ctpu_tracebuf_count(ctpu_tracebuf *tb)
{
    pthread_mutex_lock(&tb->mu);
    size_t n = tb->n;
    pthread_mutex_unlock(&tb->mu);
    return n;
}

uint64_t ctpu_tracebuf_dropped(ctpu_tracebuf *tb)
{
    pthread_mutex_lock(&tb->mu);
    uint64_t n = tb->dropped;
    pthread_mutex_unlock(&tb->mu);
    return n;
}

char *ctpu_json_escape(const char *s, char *out, size_t cap)
{
    size_t k = 0;
    if (cap == 0) return out;
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        char tmp[8];
        size_t w;
        if (c == '"' || c == '\\') { tmp[0] = '\\'; tmp[1] = (char)c; w = 2; }
        else if (c < 0x20) w = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", c);
        else { tmp[0] = (char)c; w = 1; }
        if (k + w >= cap) break;
        memcpy(out + k, tmp, w);
        k += w;
    }
    if (s && *s) {
        /* truncated: never end inside a UTF-8 sequence */
        size_t j = k;
        while (j > 0 && ((unsigned char)out[j - 1] & 0xC0) == 0x80) j--;
        if (j > 0 && ((unsigned char)out[j - 1] & 0xC0) == 0xC0) k = j - 1;
    }
    out[k] = 0;
    return out;
}

bool ctpu_tracebuf_write(ctpu_tracebuf *tb, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "trace file %s: %s", path, strerror(errno));
        return false;
    }
    pthread_mutex_lock(&tb->mu);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"ctpu\",\"events\":%zu,"
               "\"dropped_events\":%llu,\"buffer_events\":%zu},\n\"traceEvents\":[\n",
            tb->n, (unsigned long long)tb->dropped, tb->cap);
    fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"host\"}},\n"
               "{\"ph\":\"M\",\"pid\":2,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"TPU (emulated)\"}},\n"
               "{\"ph\":\"M\",\"pid\":2,\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":\"device stream\"}}");
    uint32_t seen[64] = {0};
    int nseen = 0;
    for (size_t i = 0; i < tb->n; i++) {
        const trace_ev *e = &tb->ev[i];
        if (e->track != CTPU_TRACK_HOST) continue;
        bool known = false;
        for (int j = 0; j < nseen; j++) known |= seen[j] == e->tid;
        if (known || nseen == 64) continue;
        seen[nseen++] = e->tid;
        fprintf(f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"name\":\"thread_name\",\"args\":{\"name\":\"host thread %u\"}}",
                e->tid, e->tid);
    }
    char name[160], cat[40];
    for (size_t i = 0; i < tb->n; i++) {
        const trace_ev *e = &tb->ev[i];
        fprintf(f, ",\n{\"ph\":\"%c\",\"pid\":%d,\"tid\":%u,\"ts\":%.3f,", e->ph, e->track == CTPU_TRACK_HOST ? 1 : 2,
                e->tid, (double)e->ts / 1e3);
        if (e->ph == 'X') fprintf(f, "\"dur\":%.3f,", (double)e->dur / 1e3);
        else fprintf(f, "\"s\":\"t\",");
        fprintf(f, "\"cat\":\"%s\",\"name\":\"%s\",\"args\":{%s}}", ctpu_json_escape(e->cat, cat, sizeof cat),
                ctpu_json_escape(e->name, name, sizeof name), e->args);
    }
    if (tb->dropped) {
        uint64_t last = tb->n ? tb->ev[tb->n - 1].ts : 0;
        fprintf(f, ",\n{\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":0,\"ts\":%.3f,\"cat\":\"ctpu\","
                   "\"name\":\"trace buffer full: %llu later events dropped (TORCH_TPU_TRACE_EVENTS=%llu keeps them)\","
                   "\"args\":{\"dropped_events\":%llu,\"buffer_events\":%zu,\"events_needed\":%llu}}",
                (double)last / 1e3, (unsigned long long)tb->dropped, (unsigned long long)(tb->n + tb->dropped),
                (unsigned long long)tb->dropped, tb->cap, (unsigned long long)(tb->n + tb->dropped));
    }
    fprintf(f, "\n]}\n");
    pthread_mutex_unlock(&tb->mu);
    bool ok = !ferror(f);
    int e = ok ? 0 : errno;
    if (fclose(f) != 0) {
        if (ok) e = errno;
        ok = false;
    }
    if (!ok) snprintf(err, errlen, "trace file %s: write failed: %s", path, e ? strerror(e) : "I/O error");
    return ok;
}
