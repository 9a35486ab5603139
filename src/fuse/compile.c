/* The compiler: a trace -> a program. Every node becomes one step bound to
 * the trace's inputs and outputs. (Fusion groups, dead-code elimination and
 * buffer planning for intermediates are the defer-and-fuse issue's.) */
#include <stdlib.h>
#include <string.h>

#include "exec.h"

static int slot_of(const ctpu_trace *t, int32_t v)
{
    if (v < t->n_inputs) return v;
    for (int j = 0; j < t->n_outputs; j++)
        if (t->outputs[j] == v) return t->n_inputs + j;
    return -1;
}

static const ctpu_vtype *type_of(const ctpu_trace *t, int32_t v)
{
    return v < t->n_inputs ? &t->in_type[v] : &t->nodes[v - t->n_inputs].out;
}

ctpu_compiled *ctpu_compile(const ctpu_trace *t, char *err, size_t errlen)
{
    uint64_t t0 = ctpu_now_ns();
    size_t n = (size_t)t->n_nodes, no = (size_t)t->n_outputs;
    size_t bytes = sizeof(ctpu_compiled) + n * sizeof(ctpu_step) + n * sizeof(ctpu_step_data) +
                   no * (sizeof(uint8_t) + sizeof(int64_t) + sizeof(char *)) + 64;
    char *mem = calloc(1, bytes);
    if (!mem) { snprintf(err, errlen, "out of host memory compiling a program"); return NULL; }
    ctpu_compiled *c = (ctpu_compiled *)mem;
    char *p = mem + sizeof *c;
    ctpu_step *steps = (ctpu_step *)p; p += n * sizeof(ctpu_step);
    p = (char *)(((uintptr_t)p + 15) & ~(uintptr_t)15);
    ctpu_step_data *sds = (ctpu_step_data *)p; p += n * sizeof(ctpu_step_data);
    int64_t *out_numel = (int64_t *)p; p += no * sizeof(int64_t);
    const char **out_op = (const char **)p; p += no * sizeof(char *);
    uint8_t *out_dtype = (uint8_t *)p;

    int scalar_base = 0;
    for (size_t i = 0; i < n; i++) {
        const ctpu_node *nd = &t->nodes[i];
        ctpu_step_data *sd = &sds[i];
        sd->node = *nd;
        for (int k = 0; k < nd->n_in; k++) {
            sd->in[k] = *type_of(t, nd->in[k]);
            sd->in_slot[k] = slot_of(t, nd->in[k]);
        }
        sd->out_slot = slot_of(t, t->n_inputs + (int32_t)i);
        sd->scalar_base = scalar_base;
        scalar_base += nd->n_scalars;
        steps[i].fn = ctpu_exec_fn_for(nd->op);
        steps[i].data = sd;
        bool bad = steps[i].fn == NULL || sd->out_slot < 0;
        for (int k = 0; k < nd->n_in; k++) bad |= sd->in_slot[k] < 0;
        if (bad) {
            snprintf(err, errlen, "compile: node %zu (%s) cannot be bound to a program", i,
                     ctpu_op_name(nd->op));
            free(mem);
            return NULL;
        }
    }
    for (size_t j = 0; j < no; j++) {
        const ctpu_vtype *vt = type_of(t, t->outputs[j]);
        out_dtype[j] = vt->dtype;
        out_numel[j] = ctpu_vtype_numel(vt);
        out_op[j] = t->outputs[j] >= t->n_inputs ? ctpu_op_name(t->nodes[t->outputs[j] - t->n_inputs].op) : "input";
    }
    c->mem = mem;
    c->prog = (ctpu_program){
        .n_steps = (int)n, .steps = steps, .n_in = t->n_inputs, .n_out = t->n_outputs,
        .name = n ? ctpu_op_name(t->nodes[0].op) : "empty",
        .out_dtype = out_dtype, .out_numel = out_numel, .out_op = out_op,
    };
    c->compile_ns = ctpu_now_ns() - t0;
    return c;
}

void ctpu_compiled_free(ctpu_compiled *c) { free(c ? c->mem : NULL); }
