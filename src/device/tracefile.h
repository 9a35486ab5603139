/* Chrome / Perfetto trace events (TORCH_TPU_TRACE_FILE): a bounded buffer
 * of complete ("X") and instant ("i") events on a host track (one thread id
 * per host thread) and a device track (the device thread), written as the
 * Trace Event Format's JSON object ({"traceEvents": [...]}, ts and dur in
 * microseconds) that chrome://tracing and ui.perfetto.dev load. When the
 * buffer is full, later events are dropped and counted; the file says how
 * many. Thread-safe. */
#ifndef CTPU_TRACEFILE_H
#define CTPU_TRACEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ctpu_tracebuf ctpu_tracebuf;

enum { CTPU_TRACK_HOST = 0, CTPU_TRACK_DEVICE = 1 };

/* TORCH_TPU_TRACE_EVENTS: the buffer's capacity (about 340 bytes an event). */
#define CTPU_TRACE_DEFAULT_EVENTS 65536
#define CTPU_TRACE_MAX_EVENTS (1u << 24)

/* cap events (>= 1). NULL if out of memory. */
ctpu_tracebuf *ctpu_tracebuf_create(size_t cap);
void ctpu_tracebuf_destroy(ctpu_tracebuf *tb);
/* A complete event [t0_ns, t1_ns] (ctpu_now_ns clock). cat and name are
 * copied (truncated); args is the body of a JSON object ("\"hit\":true") or
 * NULL, copied as is: build it with ctpu_json_escape for user strings. */
void ctpu_trace_complete(ctpu_tracebuf *tb, int track, const char *cat, const char *name, uint64_t t0_ns,
                         uint64_t t1_ns, const char *args);
void ctpu_trace_instant(ctpu_tracebuf *tb, int track, const char *cat, const char *name, uint64_t t_ns,
                        const char *args);
/* A program run on the device track (device.c execute): a fused program is
 * named "program N: first op" and carries "program":N (the report's id); a
 * strict one-op program (program_id 0) is named after its op. span: more
 * args (the first and last ops' numbers and labels: ",\"first_op\":3,..."),
 * or NULL. */
void ctpu_trace_program(ctpu_tracebuf *tb, const char *name, uint64_t program_id, uint64_t seq, int n_steps,
                        uint64_t t0_ns, uint64_t t1_ns, const char *span);
/* The capacity in events. */
size_t ctpu_tracebuf_capacity(ctpu_tracebuf *tb);
/* Events held and dropped so far. */
size_t ctpu_tracebuf_count(ctpu_tracebuf *tb);
uint64_t ctpu_tracebuf_dropped(ctpu_tracebuf *tb);
/* Write the JSON file. false with a one-line message on an I/O error. */
bool ctpu_tracebuf_write(ctpu_tracebuf *tb, const char *path, char *err, size_t errlen);
/* Copy s into out (cap bytes, NUL-terminated) as the inside of a JSON string
 * (quotes, backslashes and control characters escaped; truncated at a
 * character boundary). Returns out. */
char *ctpu_json_escape(const char *s, char *out, size_t cap);

#endif
