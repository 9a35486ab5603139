/* The compiler: a (finalised) trace -> a program.
 *
 * Passes: fusion grouping (runs of consecutive elementwise nodes of one
 * output shape become one block-VM step; their intermediates never exist in
 * memory), buffer planning (values used across steps but not live-out get
 * scratch offsets, reused by liveness), and emission (kernel entries for the
 * other nodes). Dead code is removed before, by ctpu_trace_finalize. A strict
 * one-node trace compiles to a single step. The program is checked here once
 * and runs unchecked. */
#include <stdlib.h>
#include <string.h>

#include "vm.h"

typedef struct {
    void **p;
    int n, cap;
} alloc_list;

static void *al_alloc(alloc_list *a, size_t bytes)
{
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 16;
        void **q = realloc(a->p, sizeof(void *) * (size_t)nc);
        if (!q) return NULL;
        a->p = q;
        a->cap = nc;
    }
    void *m = calloc(1, bytes ? bytes : 1);
    if (m) a->p[a->n++] = m;
    return m;
}

struct ctpu_program_mem {
    alloc_list al;
};

static const ctpu_vtype *type_of(const ctpu_trace *t, int32_t v)
{
    return v < t->n_inputs ? &t->in_type[v] : &t->nodes[v - t->n_inputs].out;
}

static bool same_shape(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* Can reduction node r take value v (its input) straight from a VM group?
 * sum/mean/max/min over trailing dims (inner == 1) of v's only use. */
static bool reduce_fusable(const ctpu_trace *t, const ctpu_node *r, int32_t v, const int32_t *uses)
{
    if (r->op != CTPU_OP_SUM && r->op != CTPU_OP_MEAN && r->op != CTPU_OP_MAX && r->op != CTPU_OP_MIN) return false;
    if (r->in[0] != v || uses[v] != 1 || r->attr.n_dims == 0) return false;
    const ctpu_vtype *x = type_of(t, v);
    uint32_t mask = 0;
    for (int i = 0; i < r->attr.n_dims; i++) mask |= 1u << r->attr.dims[i];
    int first = r->attr.dims[0];
    int64_t n = 1;
    for (int d = first; d < x->ndim; d++) {
        if (!(mask & (1u << d)) && x->shape[d] != 1) return false;   /* inner would be > 1 */
        n *= x->shape[d];
    }
    return n > 0 && r->out.dtype != CTPU_KDT_I32;
}

ctpu_program *ctpu_fuse_compile(const ctpu_trace *t, char *err, size_t errlen)
{
    uint64_t t0 = ctpu_now_ns();
    int nin = t->n_inputs, nn = t->n_nodes, no = t->n_outputs, nv = nin + nn;
    alloc_list al = { 0 };
    ctpu_program *c = al_alloc(&al, sizeof *c);
    int32_t *slot_of = al_alloc(&al, sizeof(int32_t) * (size_t)(nv + 1));
    int32_t *group = al_alloc(&al, sizeof(int32_t) * (size_t)(nn + 1));
    int32_t *scal_base = al_alloc(&al, sizeof(int32_t) * (size_t)(nn + 1));
    int32_t *last_use = al_alloc(&al, sizeof(int32_t) * (size_t)(nv + 1));  /* step index */
    int32_t *def_step = al_alloc(&al, sizeof(int32_t) * (size_t)(nv + 1));
    bool *used_outside = al_alloc(&al, (size_t)(nn + 1));
    ctpu_step *steps = al_alloc(&al, sizeof(ctpu_step) * (size_t)(nn + 1));
    uint8_t *out_dtype = al_alloc(&al, (size_t)no + 1);
    int64_t *out_numel = al_alloc(&al, sizeof(int64_t) * ((size_t)no + 1));
    const char **out_op = al_alloc(&al, sizeof(char *) * ((size_t)no + 1));
    if (!c || !slot_of || !group || !scal_base || !last_use || !def_step || !used_outside || !steps ||
        !out_dtype || !out_numel || !out_op)
        goto oom;

    /* bound slots: inputs, then outputs */
    for (int v = 0; v < nv; v++) slot_of[v] = v < nin ? v : -1;
    for (int j = 0; j < no; j++) slot_of[t->outputs[j]] = nin + j;
    for (int i = 0, s = 0; i < nn; i++) { scal_base[i] = s; s += t->nodes[i].n_scalars; }

    /* uses of each value (node inputs and program outputs) */
    int32_t *uses = al_alloc(&al, sizeof(int32_t) * (size_t)(nv + 1));
    int32_t *epi = al_alloc(&al, sizeof(int32_t) * 3 * (size_t)(nn + 1));  /* per matmul: bias, act, res */
    if (!uses || !epi) goto oom;
    for (int i = 0; i < nn; i++)
        for (int k = 0; k < t->nodes[i].n_in; k++) uses[t->nodes[i].in[k]]++;
    for (int j = 0; j < no; j++) uses[t->outputs[j]] += 2;   /* an output is never internal */

    /* fusion groups: a 2-D f32 matmul with its bias / activation / residual
     * epilogue (the MXU kernel applies it to the accumulator, bit-identical to
     * the separate ops); maximal runs of consecutive VM-fusable nodes of one
     * shape (their in-group operands have that shape) */
    int n_groups = 0;
    for (int i = 0; i < nn;) {
        const ctpu_node *n = &t->nodes[i];
        const ctpu_vtype *it[CTPU_NODE_MAX_IN];
        for (int k = 0; k < n->n_in; k++) it[k] = type_of(t, n->in[k]);
        int j = i + 1;
        epi[3 * i] = epi[3 * i + 1] = epi[3 * i + 2] = -1;
        if (n->op == CTPU_OP_MATMUL && n->out.ndim == 2 && n->out.dtype == CTPU_KDT_F32 && !t->debug_checks) {
            int32_t cur = nin + i;                  /* the value the chain has produced so far */
            int stage = 0;                          /* 0: bias or residual next, 1: act, 2: residual */
            while (j < nn && uses[cur] == 1) {
                const ctpu_node *m = &t->nodes[j];
                if (!same_shape(&m->out, &n->out) || m->out.dtype != CTPU_KDT_F32) break;
                if (m->op == CTPU_OP_ADD && (m->in[0] == cur || m->in[1] == cur)) {
                    int32_t other = m->in[0] == cur ? m->in[1] : m->in[0];
                    const ctpu_vtype *ot = type_of(t, other);
                    if (other == cur || ot->dtype != CTPU_KDT_F32) break;
                    bool is_bias = (ot->ndim == 1 && ot->shape[0] == n->out.shape[1]) ||
                                   (ot->ndim == 2 && ot->shape[0] == 1 && ot->shape[1] == n->out.shape[1]);
                    bool is_res = same_shape(ot, &n->out);
                    if (stage == 0 && is_bias && n->out.shape[0] != 1) { epi[3 * i] = other; stage = 1; }
                    else if (is_res && epi[3 * i + 2] < 0) { epi[3 * i + 2] = other; stage = 3; }
                    else break;
                } else if (stage <= 1 && m->in[0] == cur &&
                           (m->op == CTPU_OP_RELU || m->op == CTPU_OP_GELU_TANH || m->op == CTPU_OP_GELU_ERF)) {
                    epi[3 * i + 1] = m->op == CTPU_OP_RELU ? CTPU_K_ACT_RELU
                                     : m->op == CTPU_OP_GELU_TANH ? CTPU_K_ACT_GELU_TANH : CTPU_K_ACT_GELU_ERF;
                    stage = 2;
                } else {
                    break;
                }
                cur = nin + j;
                j++;
                if (stage == 3) break;
            }
        } else if (ctpu_vm_fusable(n, it) && !t->debug_checks) {
            /* externals: distinct values read from outside the group */
            int32_t ext[CTPU_BCAST_MAX];
            int n_ext = 0;
            bool ok = true;
            for (j = i; j < nn && j - i < CTPU_VM_GROUP_NODES && ok; j++) {
                const ctpu_node *m = &t->nodes[j];
                for (int k = 0; k < m->n_in; k++) it[k] = type_of(t, m->in[k]);
                if (j > i && (!ctpu_vm_fusable(m, it) || !same_shape(&m->out, &n->out))) break;
                int32_t add[3];
                int n_add = 0;
                for (int k = 0; k < m->n_in; k++) {
                    int32_t v = m->in[k];
                    if (v >= nin + i) continue;                 /* made in the group */
                    bool seen = false;
                    for (int q = 0; q < n_ext; q++) seen |= ext[q] == v;
                    for (int q = 0; q < n_add; q++) seen |= add[q] == v;
                    if (!seen) add[n_add++] = v;
                }
                if (n_ext + n_add > CTPU_BCAST_MAX) break;
                for (int q = 0; q < n_add; q++) ext[n_ext++] = add[q];
            }
            /* a reduction over trailing dims of the group's last value, its only use */
            if (j < nn && reduce_fusable(t, &t->nodes[j], nin + j - 1, uses)) j++;
        }
        for (int k = i; k < j; k++) group[k] = n_groups;
        n_groups++;
        i = j;
    }
    /* values used outside their group (or by a later step) need memory */
    for (int i = 0; i < nn; i++) {
        const ctpu_node *n = &t->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            int32_t v = n->in[k];
            if (v >= nin && group[v - nin] != group[i]) used_outside[v - nin] = true;
        }
    }
    for (int j = 0; j < no; j++)
        if (t->outputs[j] >= nin) used_outside[t->outputs[j] - nin] = true;

    /* emission: one step per group (VM if it has 2+ nodes) */
    int n_steps = 0;
    for (int v = 0; v < nv; v++) { last_use[v] = -1; def_step[v] = -1; }
    int32_t *group_step = al_alloc(&al, sizeof(int32_t) * (size_t)(n_groups + 1));
    if (!group_step) goto oom;
    for (int i = 0; i < nn;) {
        int j = i;
        while (j < nn && group[j] == group[i]) j++;
        group_step[group[i]] = n_steps;
        for (int k = i; k < j; k++) {
            def_step[nin + k] = n_steps;
            for (int q = 0; q < t->nodes[k].n_in; q++) {
                int32_t v = t->nodes[k].in[q];
                if (v < nin || group[v - nin] != group[k]) last_use[v] = n_steps;
            }
        }
        n_steps++;
        i = j;
    }

    /* buffer planning: values needing memory that are not bound get scratch
     * offsets; an offset is reused once the value there is dead (first fit) */
    int n_virtual = 0;
    for (int v = nin; v < nv; v++)
        if (slot_of[v] < 0 && used_outside[v - nin]) n_virtual++;
    size_t *virt_off = al_alloc(&al, sizeof(size_t) * ((size_t)n_virtual + 1));
    int32_t *vv = al_alloc(&al, sizeof(int32_t) * ((size_t)n_virtual + 1));
    size_t *vsize = al_alloc(&al, sizeof(size_t) * ((size_t)n_virtual + 1));
    if (!virt_off || !vv || !vsize) goto oom;
    size_t scratch = 0;
    {
        int k = 0;
        for (int v = nin; v < nv; v++) {
            if (slot_of[v] >= 0 || !used_outside[v - nin]) continue;
            const ctpu_vtype *ty = type_of(t, v);
            size_t sz = ((size_t)ctpu_vtype_numel(ty) * ctpu_kdt_size(ty->dtype) + 63) & ~(size_t)63;
            /* first fit among offsets of values dead before this one is defined */
            size_t off = 0;
            bool moved = true;
            while (moved) {
                moved = false;
                for (int q = 0; q < k; q++) {
                    /* a value read at or after v's defining step is still alive */
                    if (last_use[vv[q]] < def_step[v]) continue;
                    if (off < virt_off[q] + vsize[q] && virt_off[q] < off + sz) {
                        off = virt_off[q] + vsize[q];
                        moved = true;
                    }
                }
            }
            vv[k] = v;
            vsize[k] = sz;
            virt_off[k] = off;
            slot_of[v] = nin + no + 1 + k;    /* after the scratch buffer's own slot */
            if (off + sz > scratch) scratch = off + sz;
            k++;
        }
    }

    /* steps */
    for (int i = 0, s = 0; i < nn; s++) {
        int j = i;
        while (j < nn && group[j] == group[i]) j++;
        if (j - i >= 2 && t->nodes[i].op == CTPU_OP_MATMUL) {
            const ctpu_node *nd = &t->nodes[i];
            ctpu_step_data *sd = al_alloc(&al, sizeof *sd);
            if (!sd) goto oom;
            sd->node = *nd;
            for (int q = 0; q < nd->n_in; q++) {
                sd->in[q] = *type_of(t, nd->in[q]);
                sd->in_slot[q] = slot_of[nd->in[q]];
            }
            sd->out_slot = slot_of[nin + j - 1];          /* the chain's last value */
            sd->scalar_base = scal_base[i];
            sd->epi_bias_slot = epi[3 * i] >= 0 ? slot_of[epi[3 * i]] : -1;
            sd->epi_act = (uint8_t)(epi[3 * i + 1] >= 0 ? epi[3 * i + 1] : CTPU_K_ACT_NONE);
            sd->epi_res_slot = epi[3 * i + 2] >= 0 ? slot_of[epi[3 * i + 2]] : -1;
            if (sd->out_slot < 0 || sd->in_slot[0] < 0 || sd->in_slot[1] < 0 ||
                (epi[3 * i] >= 0 && sd->epi_bias_slot < 0) || (epi[3 * i + 2] >= 0 && sd->epi_res_slot < 0)) {
                snprintf(err, errlen, "compile: matmul epilogue at node %d cannot be bound", i);
                goto fail;
            }
            steps[s] = (ctpu_step){ ctpu_exec_fn_for(CTPU_OP_MATMUL), sd };
            i = j;
            continue;
        }
        if (j - i >= 2 && ctpu_op_is(t->nodes[j - 1].op, CTPU_OPK_REDUCTION)) {
            /* producers fused into the reduction (node j-1) */
            const ctpu_node *rn = &t->nodes[j - 1];
            ctpu_vm_red_prog *rp = al_alloc(&al, sizeof *rp);
            int idx[CTPU_VM_MAX_NODES];
            bool store[CTPU_VM_MAX_NODES];
            if (!rp) goto oom;
            int32_t red_slot = nin + no + 1 + n_virtual;   /* no buffer has it */
            int32_t keep = slot_of[nin + j - 2];
            slot_of[nin + j - 2] = red_slot;
            for (int k = i; k < j - 1; k++) { idx[k - i] = k; store[k - i] = used_outside[k] || k == j - 2; }
            int bad = ctpu_vm_build(&rp->vm, t, idx, j - 1 - i, slot_of, store, scal_base);
            slot_of[nin + j - 2] = keep;
            const ctpu_vtype *xt = &t->nodes[j - 2].out;
            int64_t n = 1;
            for (int d = rn->attr.dims[0]; d < xt->ndim; d++) n *= xt->shape[d];
            rp->op = (ctpu_k_red_op)ctpu_op_infos[rn->op].kop;
            rp->mean = rn->op == CTPU_OP_MEAN;
            rp->n = n;
            rp->outer = ctpu_vtype_numel(xt) / n;
            rp->red_slot = red_slot;
            rp->out_slot = slot_of[nin + j - 1];
            rp->out_dtype = rn->out.dtype;
            if (bad || rp->out_slot < 0) {
                snprintf(err, errlen, "compile: reduction fusion at node %d cannot be built", j - 1);
                goto fail;
            }
            steps[s] = (ctpu_step){ ctpu_vm_red_exec, rp };
            i = j;
            continue;
        }
        if (j - i >= 2) {
            ctpu_vm_prog *vp = al_alloc(&al, sizeof *vp);
            int idx[CTPU_VM_MAX_NODES];
            bool store[CTPU_VM_MAX_NODES];
            if (!vp) goto oom;
            for (int k = i; k < j; k++) { idx[k - i] = k; store[k - i] = used_outside[k]; }
            if (ctpu_vm_build(vp, t, idx, j - i, slot_of, store, scal_base) != 0) {
                snprintf(err, errlen, "compile: fusion group at node %d does not fit the VM", i);
                goto fail;
            }
            steps[s] = (ctpu_step){ ctpu_vm_exec, vp };
            i = j;
            continue;
        }
        const ctpu_node *nd = &t->nodes[i];
        ctpu_step_data *sd = al_alloc(&al, sizeof *sd);
        if (!sd) goto oom;
        sd->node = *nd;
        for (int q = 0; q < nd->n_in; q++) {
            sd->in[q] = *type_of(t, nd->in[q]);
            sd->in_slot[q] = slot_of[nd->in[q]];
        }
        sd->out_slot = slot_of[nin + i];
        sd->scalar_base = scal_base[i];
        sd->epi_bias_slot = sd->epi_res_slot = -1;
        ctpu_step_fn fn = ctpu_exec_fn_for(nd->op);
        bool bad = fn == NULL || sd->out_slot < 0;
        for (int q = 0; q < nd->n_in; q++) bad |= sd->in_slot[q] < 0;
        if (bad) {
            snprintf(err, errlen, "compile: node %d (%s) cannot be bound to a program", i, ctpu_op_name(nd->op));
            goto fail;
        }
        steps[s] = (ctpu_step){ fn, sd };
        i = j;
    }

    for (int j = 0; j < no; j++) {
        const ctpu_vtype *vt = type_of(t, t->outputs[j]);
        out_dtype[j] = vt->dtype;
        out_numel[j] = ctpu_vtype_numel(vt);
        out_op[j] = t->outputs[j] >= nin ? ctpu_op_name(t->nodes[t->outputs[j] - nin].op) : "input";
    }
    /* per-output dependencies on inputs and steps: a fault poisons only the
     * outputs computed from it (multi-node programs; skipped past ~8 MiB) */
    int wi = (nin + 63) / 64 + 1, ws = (n_steps + 63) / 64 + 1;
    uint64_t *odi = NULL, *ods = NULL;
    if (nn > 1 && (size_t)nv * (size_t)(wi + ws) <= ((size_t)1 << 20)) {
        uint64_t *dep = calloc((size_t)nv * (size_t)(wi + ws), sizeof(uint64_t));
        odi = al_alloc(&al, sizeof(uint64_t) * (size_t)wi * ((size_t)no + 1));
        ods = al_alloc(&al, sizeof(uint64_t) * (size_t)ws * ((size_t)no + 1));
        if (!dep || !odi || !ods) {
            free(dep);
            goto oom;
        }
        for (int v = 0; v < nin; v++) dep[(size_t)v * (size_t)(wi + ws) + (size_t)(v >> 6)] |= 1ull << (v & 63);
        for (int k = 0; k < nn; k++) {
            uint64_t *d = dep + (size_t)(nin + k) * (size_t)(wi + ws);
            for (int q = 0; q < t->nodes[k].n_in; q++) {
                const uint64_t *e = dep + (size_t)t->nodes[k].in[q] * (size_t)(wi + ws);
                for (int w = 0; w < wi + ws; w++) d[w] |= e[w];
            }
            int st = group_step[group[k]];
            d[wi + (st >> 6)] |= 1ull << (st & 63);
        }
        for (int j = 0; j < no; j++) {
            const uint64_t *d = dep + (size_t)t->outputs[j] * (size_t)(wi + ws);
            memcpy(odi + (size_t)j * (size_t)wi, d, sizeof(uint64_t) * (size_t)wi);
            memcpy(ods + (size_t)j * (size_t)ws, d + wi, sizeof(uint64_t) * (size_t)ws);
        }
        free(dep);
    }
    /* debug checks: each step's value (one node per step when checks are on) */
    int32_t *so_slot = NULL;
    uint8_t *so_dt = NULL;
    int64_t *so_n = NULL;
    const char **so_op = NULL;
    if (t->debug_checks && nn > 1) {
        so_slot = al_alloc(&al, sizeof(int32_t) * ((size_t)n_steps + 1));
        so_dt = al_alloc(&al, (size_t)n_steps + 1);
        so_n = al_alloc(&al, sizeof(int64_t) * ((size_t)n_steps + 1));
        so_op = al_alloc(&al, sizeof(char *) * ((size_t)n_steps + 1));
        if (!so_slot || !so_dt || !so_n || !so_op) goto oom;
        for (int st = 0; st < n_steps; st++) so_slot[st] = -1;
        for (int k = 0; k < nn; k++) {
            int st = group_step[group[k]];   /* the group's last node names the step */
            so_slot[st] = slot_of[nin + k];
            so_dt[st] = t->nodes[k].out.dtype;
            so_n[st] = ctpu_vtype_numel(&t->nodes[k].out);
            so_op[st] = ctpu_op_name(t->nodes[k].op);
        }
    }
    c->mem = al.p;
    c->n_mem = al.n;
    c->prog = (ctpu_dev_program){
        .n_steps = n_steps, .steps = steps, .n_in = nin, .n_out = no,
        .name = nn ? ctpu_op_name(t->nodes[0].op) : "empty",
        .out_dtype = out_dtype, .out_numel = out_numel, .out_op = out_op,
        .n_virtual = n_virtual ? n_virtual : 0, .virt_off = virt_off,
        .scratch_slot = nin + no, .scratch_bytes = n_virtual ? scratch : 0,
        .dep_words_in = wi, .dep_words_step = ws, .out_dep_in = odi, .out_dep_step = ods,
        .step_out_slot = so_slot, .step_out_dtype = so_dt, .step_out_numel = so_n, .step_op = so_op,
    };
    c->n_groups = n_groups;
    c->compile_ns = ctpu_now_ns() - t0;
    return c;
oom:
    snprintf(err, errlen, "out of host memory compiling a program");
fail:
    for (int i = 0; i < al.n; i++) free(al.p[i]);
    free(al.p);
    return NULL;
}

void ctpu_program_free(ctpu_program *c)
{
    if (!c) return;
    free(c->plan);
    free(atomic_load(&c->op_cost));
    void **m = c->mem;
    int n = c->n_mem;
    for (int i = n - 1; i >= 0; i--) free(m[i]);   /* c itself is m[0] */
    free(m);
}
