/* Report hooks (report.c): called by the runtime, dispatch, defer and step
 * paths. All are cheap no-ops when the runtime has no report state. */
#ifndef CTPU_REPORT_H
#define CTPU_REPORT_H

#include "eager.h"

typedef struct ctpu_report_state ctpu_report_state;

/* ctpu_init, after the environment is read: state, CTPU_QUIET, the trace
 * buffer when TORCH_TPU_TRACE_FILE is set. CTPU_ERR_ENV (bad CTPU_QUIET) or
 * CTPU_ERR_OOM with a message in err. */
ctpu_status ctpu__report_init(ctpu_runtime *rt, char *err, size_t len);
/* ctpu_shutdown, before teardown: the metrics file or the one-line
 * summary, the trace file. */
void ctpu__report_shutdown(ctpu_runtime *rt);
void ctpu__report_free(ctpu_runtime *rt);

/* One cost-table row as a JSON object (the metrics document's rows, and
 * src/report/render.c's json format). */
struct cJSON;
struct cJSON *ctpu__cost_row_json(const ctpu_cost_row *w);

/* The hooks (ctpu__report_cut, _op, _host_read, _step, _sync) are declared
 * in eager.h, so the paths that call them need no other include. */

#endif
