/* The block VM: a fused group of elementwise nodes runs over the output in
 * blocks of CTPU_K_BLOCK elements (numexpr's design). Operands are loaded
 * into f32 block registers (broadcast-aware; contiguous f32 operands are
 * read in place), each instruction is one elementwise kernel over the block,
 * rounded to its node's dtype exactly as the separate op would be
 * (CONTRACTS.md: no excess precision in fused chains), and only the values
 * needed outside the group are stored. On SIMD kernels the instructions of
 * a block run as one tape (kernels.h ctpu_k_tape): every op on a strip of a
 * few vectors in registers, then the next strip, so a chain costs one load
 * and one store per element instead of one per op; the same bits. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vm.h"
#include "testing.h"

/* ctpu__test_vm_tape(false): every group as block kernels (the tests compare both paths). */
static _Atomic bool vm_tape_off;
void ctpu__test_vm_tape(bool on) { vm_tape_off = !on; }
static bool ctx_tape_off(void) { return vm_tape_off; }

typedef struct {
    const ctpu_vm_prog *p;
    ctpu_exec_ctx *ctx;
    int64_t chunk;              /* elements a claim takes (whole blocks) */
    _Atomic int64_t next;       /* the next chunk to claim */
} vm_job;

static void vm_range_to(const ctpu_vm_prog *p, ctpu_exec_ctx *ctx, int64_t b0, int64_t b1, int32_t red_slot,
                        float *red_buf);
static void vm_range(const ctpu_vm_prog *p, ctpu_exec_ctx *ctx, int64_t b0, int64_t b1)
{
    vm_range_to(p, ctx, b0, b1, -1, NULL);
}

/* Ask for the next block of each contiguous operand and DIRECT output
 * while this one is computed: a block of f32 is one 4 KiB page, and the
 * hardware prefetchers stop at page boundaries. The block-kernel path only:
 * the tape reads each operand once, a strip at a time, and there the burst
 * of 64 prefetches per operand at each block's start cost more than it
 * saved (issue 18, the Intel machine: the 16M chain 16.1-18.1 ms of
 * process CPU time with it, 11.9-16.0 without, 5 runs each; the 1M chain 0.94-0.97 ->
 * 0.77-0.85 ms). */
static void vm_prefetch_next(const ctpu_vm_prog *p, const ctpu_exec_ctx *ctx, int64_t s, int64_t b1, int32_t red_slot)
{
    if (s + CTPU_K_BLOCK >= b1) return;
    for (int e = 0; e < p->n_ext; e++) {
        if (p->plan.mode[e] != 0 || p->plan.nd == 0) continue;
        size_t es = ctpu_kdt_size(p->ext_dtype[e]);
        const char *nx = (const char *)ctx->ptr[p->ext_slot[e]] + (size_t)(s + CTPU_K_BLOCK) * es;
        for (size_t off = 0; off < CTPU_K_BLOCK * es; off += 64) __builtin_prefetch(nx + off, 0, 3);
    }
    for (int i = 0; i < p->n_ins; i++) {
        if ((p->ins[i].flags & (CTPU_VM_DIRECT | CTPU_VM_STREAM)) != CTPU_VM_DIRECT || p->ins[i].scalar2 == red_slot)
            continue;
        const char *nx = (const char *)ctx->ptr[p->ins[i].scalar2] + (size_t)(s + CTPU_K_BLOCK) * 4;
        for (size_t off = 0; off < CTPU_K_BLOCK * 4; off += 64) __builtin_prefetch(nx + off, 1, 3);
    }
}

/* One block [s, s + n) as block kernels, instruction by instruction. */
static void vm_block_ops(const ctpu_vm_prog *p, ctpu_exec_ctx *ctx, int64_t s, int64_t n, int64_t b0,
                         int32_t red_slot, float *red_buf, float (*reg)[CTPU_K_BLOCK], const float **rp)
{
    const double *sc = ctx->scalars;
    for (int i = 0; i < p->n_ins; i++) {
        const ctpu_vm_ins *in = &p->ins[i];
        float *d = in->dst >= 0 ? reg[in->dst] : NULL;
        /* a stored f32 value is computed straight into its output */
        bool stream = (in->flags & CTPU_VM_STREAM) && in->scalar2 != red_slot;
        if ((in->flags & CTPU_VM_DIRECT) && !stream)
            d = in->scalar2 == red_slot ? red_buf + (s - b0) : (float *)ctx->ptr[in->scalar2] + s;
        switch (in->kind) {
        case CTPU_VM_LOAD: {
            int e = in->a;
            rp[in->dst] = ctpu_load_block(ctx->ptr[p->ext_slot[e]], p->ext_dtype[e], &p->plan, e, s, n, d);
            continue;
        }
        case CTPU_VM_STORE: {
            int dt = in->kop;
            if (in->scalar == red_slot) {     /* f32 block into the chunk (exact for bf16 values) */
                memcpy(red_buf + (s - b0), rp[in->a], sizeof(float) * (size_t)n);
                continue;
            }
            char *base = ctx->ptr[in->scalar];
            ctpu_from_f32(rp[in->a], dt, base + (size_t)s * ctpu_kdt_size(dt), n);
            continue;
        }
        case CTPU_VM_UNARY: ctpu_k_unary((ctpu_k_unary_op)in->kop, rp[in->a], d, n); break;
        case CTPU_VM_BINARY: ctpu_k_binary((ctpu_k_binary_op)in->kop, rp[in->a], rp[in->b], d, n); break;
        case CTPU_VM_SCALAR:
            ctpu_k_binary_scalar((ctpu_k_binary_op)in->kop, rp[in->a], (float)sc[in->scalar],
                                 (in->flags & CTPU_VM_SCALAR_FIRST) != 0, d, n);
            break;
        case CTPU_VM_WHERE: ctpu_k_where(rp[in->a], rp[in->b], rp[in->c], d, n); break;
        case CTPU_VM_CLAMP:
            ctpu_k_clamp(rp[in->a], (float)sc[in->scalar], (float)sc[in->scalar + 1], d, n);
            break;
        case CTPU_VM_COPY:
            if (rp[in->a] != d) memcpy(d, rp[in->a], sizeof(float) * (size_t)n);
            break;
        case CTPU_VM_FILL: {   /* as exec_full: (float) of the scalar, then the dtype's rounding */
            float v = (float)sc[in->scalar];
            for (int64_t q = 0; q < n; q++) d[q] = v;
            break;
        }
        default: break;
        }
        if (in->flags & CTPU_VM_ROUND_BF16) ctpu_k_unary(CTPU_K_U_ROUND_BF16, d, d, n);
        if (stream) ctpu_k_stream_f32((float *)ctx->ptr[in->scalar2] + s, d, n);
        rp[in->dst] = d;
    }
}

/* [b0, b1) as the program's tape (vm.h), block by block: the externals
 * loaded (or read in place), then every op on each strip in registers.
 * False, having stored nothing, when the kernels have no tape. */
static bool vm_range_tape(const ctpu_vm_prog *p, ctpu_exec_ctx *ctx, int64_t b0, int64_t b1, int32_t red_slot,
                          float *red_buf, float (*reg)[CTPU_K_BLOCK])
{
    ctpu_k_tape_ins tape[CTPU_VM_MAX_INS];
    float *val[CTPU_BCAST_MAX + CTPU_VM_MAX_REGS];
    ctpu_k_tape_out out[CTPU_VM_MAX_NODES];
    const double *sc = ctx->scalars;
    memcpy(tape, p->tape, sizeof(ctpu_k_tape_ins) * (size_t)p->n_tape);
    for (int j = 0; j < p->n_tape; j++) {   /* this launch's runtime scalars */
        const ctpu_vm_ins *in = &p->ins[p->tape_ins[j]];
        if (in->kind == CTPU_VM_SCALAR || in->kind == CTPU_VM_CLAMP || in->kind == CTPU_VM_FILL)
            tape[j].s0 = (float)sc[in->scalar];
        if (in->kind == CTPU_VM_CLAMP) tape[j].s1 = (float)sc[in->scalar + 1];
    }
    for (int r = 0; r < p->n_reg; r++) val[p->n_ext + r] = reg[r];
    for (int o = 0; o < p->n_out; o++)
        out[o].kind = p->out_slot[o] == red_slot ? CTPU_K_TO_F32
                    : p->out_bf16[o] ? CTPU_K_TO_BF16
                    : (p->ins[p->out_ins[o]].flags & CTPU_VM_STREAM) ? CTPU_K_TO_F32_STREAM : CTPU_K_TO_F32;
    for (int64_t s = b0; s < b1; s += CTPU_K_BLOCK) {
        int64_t n = b1 - s < CTPU_K_BLOCK ? b1 - s : CTPU_K_BLOCK;
        for (int e = 0; e < p->n_ext; e++)   /* its own buffer past the registers */
            val[e] = (float *)ctpu_load_block(ctx->ptr[p->ext_slot[e]], p->ext_dtype[e], &p->plan, e, s, n,
                                              reg[p->n_reg + e]);
        for (int o = 0; o < p->n_out; o++)
            out[o].p = p->out_slot[o] == red_slot ? (void *)(red_buf + (s - b0))
                     : (char *)ctx->ptr[p->out_slot[o]] + (size_t)s * (p->out_bf16[o] ? 2 : 4);
        if (!ctpu_k_tape(tape, p->n_tape, val, out, n)) return false;
    }
    return true;
}

/* The block registers: one cached block per slot, taken and given back by
 * atomic exchange (concurrent ranges never share it; a loser allocates its
 * own), as the MXU driver's workspace. A malloc and free of a step's
 * buffers at every range was most of a small group's time (a 32-element
 * AdamW update: 20 block registers, 80 KiB, about 0.3 of 0.8 us; above
 * glibc's mmap threshold, a mapping and its page faults each time). Memory
 * only: nothing computed depends on it. */
static float *scratch_take(_Atomic(char *) *slot, size_t floats)
{
    char *m = atomic_exchange(slot, NULL);
    if (m && *(size_t *)m >= floats) return (float *)(m + 64);
    free(m);
    m = aligned_alloc(64, 64 + (sizeof(float) * floats + 63) / 64 * 64);
    if (!m) return NULL;
    *(size_t *)m = floats;
    return (float *)(m + 64);
}

static void scratch_give(_Atomic(char *) *slot, float *p) { free(atomic_exchange(slot, (char *)p - 64)); }

static _Atomic(char *) vm_regs_cached;

/* Run the program over output elements [b0, b1). A value stored to slot
 * `red_slot` lands in red_buf[s - b0] instead (a producer fused into a
 * reduction: the chunk being reduced). */
static void vm_range_to(const ctpu_vm_prog *p, ctpu_exec_ctx *ctx, int64_t b0, int64_t b1, int32_t red_slot,
                        float *red_buf)
{
    size_t nbuf = (size_t)(p->n_reg + p->n_ext ? p->n_reg + p->n_ext : 1);
    const float *rp_inl[CTPU_VM_MAX_REGS + CTPU_BCAST_MAX];
    float (*reg)[CTPU_K_BLOCK] = (float (*)[CTPU_K_BLOCK])scratch_take(&vm_regs_cached, CTPU_K_BLOCK * nbuf);
    const float **rp = nbuf <= sizeof rp_inl / sizeof *rp_inl ? rp_inl : malloc(sizeof(float *) * nbuf);
    if (!reg || !rp) {
        if (reg) scratch_give(&vm_regs_cached, &reg[0][0]);
        if (rp != rp_inl) free(rp);
        ctx->fault_status = CTPU_ERR_OOM;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "fused program: out of host memory for VM registers");
        return;
    }
    if (!(p->n_tape > 0 && !ctx_tape_off() && vm_range_tape(p, ctx, b0, b1, red_slot, red_buf, reg))) {
        for (int64_t s = b0; s < b1; s += CTPU_K_BLOCK) {
            int64_t n = b1 - s < CTPU_K_BLOCK ? b1 - s : CTPU_K_BLOCK;
            vm_prefetch_next(p, ctx, s, b1, red_slot);
            vm_block_ops(p, ctx, s, n, b0, red_slot, red_buf, reg, rp);
        }
    }
    ctpu_k_stream_fence();   /* the streamed blocks are visible before the step ends */
    scratch_give(&vm_regs_cached, &reg[0][0]);
    if (rp != rp_inl) free(rp);
}

/* Each kernel thread claims chunks of whole blocks from a shared counter
 * until none is left: a thread the OS delays (the cores shared with other
 * jobs) takes fewer, instead of the step waiting for its fixed half. Every
 * element is computed by the same tape whichever thread runs it: the same
 * bits. */
static void vm_task(void *arg, int tid, int nt)
{
    (void)tid;
    (void)nt;
    vm_job *j = arg;
    int64_t total = j->p->numel;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= (total + j->chunk - 1) / j->chunk) break;
        int64_t b0 = c * j->chunk, b1 = b0 + j->chunk < total ? b0 + j->chunk : total;
        vm_range(j->p, j->ctx, b0, b1);
    }
}

void ctpu_vm_exec(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_vm_prog *p = data;
    if (p->numel == 0) return;
    if (p->numel >= (1 << 16) && ctx->pool && ctx->pool->nthreads > 1) {
        /* about 8 chunks a thread, at least 16 blocks (64 KiB of f32) each */
        int64_t nblocks = (p->numel + CTPU_K_BLOCK - 1) / CTPU_K_BLOCK;
        int64_t per = nblocks / (8 * (int64_t)ctx->pool->nthreads);
        vm_job j = { p, ctx, (per > 16 ? per : 16) * CTPU_K_BLOCK, 0 };
        ctx->pool->run(ctx->pool, vm_task, &j);
    } else {
        vm_range(p, ctx, 0, p->numel);
    }
}

/* ------------------------------------------------------------ building */
/* Equal after their leading 1s are dropped (or one element): a reshape
 * between them broadcasts as its input does (NumPy aligns on the right). */
static bool bcast_equivalent(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (ctpu_vtype_numel(a) == 1 && ctpu_vtype_numel(b) == 1) return true;
    int i = 0, j = 0;
    while (i < a->ndim && a->shape[i] == 1) i++;
    while (j < b->ndim && b->shape[j] == 1) j++;
    if (a->ndim - i != b->ndim - j) return false;
    for (; i < a->ndim; i++, j++)
        if (a->shape[i] != b->shape[j]) return false;
    return true;
}

bool ctpu_vm_fusable(const ctpu_node *n, const ctpu_vtype *const *in_types)
{
    int fc = ctpu_op_fusion(n->op);
    /* movement the VM does as a copy of a broadcast operand (expand; a
     * reshape that changes only leading 1s), f32 only: they copy bits, and
     * a bf16 value through an f32 register is rounded again (its
     * subnormals flushed; fuzz seed 350); and a constant fill (full) */
    if (n->op == CTPU_OP_EXPAND || (n->op == CTPU_OP_RESHAPE && bcast_equivalent(in_types[0], &n->out)))
        return n->out.dtype == CTPU_KDT_F32;
    if (n->op == CTPU_OP_FULL) return n->out.dtype != CTPU_KDT_I32;
    if (fc != CTPU_FUSE_VM && fc != CTPU_FUSE_ADD && fc != CTPU_FUSE_ACT) return false;
    if (n->out.dtype == CTPU_KDT_I32) return false;          /* the exact int path */
    if (ctpu_op_is(n->op, CTPU_OPK_COMPARE)) {
        bool all_int = true;
        for (int i = 0; i < n->n_in; i++) all_int &= in_types[i]->dtype == CTPU_KDT_I32;
        if (all_int) return false;
    }
    return true;
}

/* The fused-epilogue activation of each CTPU_FUSE_ACT op (tests/test_fuse.c
 * checks this table against the op table's fusion classes). */
static const uint8_t epi_act[CTPU_OP_COUNT] = {
    [CTPU_OP_RELU] = CTPU_K_ACT_RELU,
    [CTPU_OP_GELU_TANH] = CTPU_K_ACT_GELU_TANH,
    [CTPU_OP_GELU_ERF] = CTPU_K_ACT_GELU_ERF,
};

int ctpu_vm_epi_act(int op) { return op >= 0 && op < CTPU_OP_COUNT ? epi_act[op] : CTPU_K_ACT_NONE; }

/* ------------------------------------------------------------ the tape form */
/* The tape source of register r at tape instruction nt (holder: per
 * register, the tape instruction whose value it holds, or -2 - e for
 * external e): the previous result in registers (-1), the external's
 * array, or register r's array (its producer then stores it). -2: none. */
static int tape_src(ctpu_vm_prog *p, const int16_t *holder, int r, int nt)
{
    if (r < 0 || r >= CTPU_VM_MAX_REGS) return -2;
    int h = holder[r];
    if (h == INT16_MIN) return -2;
    if (h <= -2) return -2 - h;
    if (h == nt - 1) return -1;
    p->tape[h].dst = (int8_t)(p->n_ext + r);
    return p->n_ext + r;
}

static const uint8_t tape_kind[] = {
    [CTPU_VM_UNARY] = CTPU_K_T_UNARY, [CTPU_VM_BINARY] = CTPU_K_T_BINARY, [CTPU_VM_SCALAR] = CTPU_K_T_AS,
    [CTPU_VM_WHERE] = CTPU_K_T_WHERE, [CTPU_VM_CLAMP] = CTPU_K_T_CLAMP, [CTPU_VM_COPY] = CTPU_K_T_COPY,
    [CTPU_VM_FILL] = CTPU_K_T_FILL,
};
/* sources each kind reads (a, then b, then c) */
static const uint8_t tape_nsrc[CTPU_K_T_COUNT] = {
    [CTPU_K_T_UNARY] = 1, [CTPU_K_T_BINARY] = 2, [CTPU_K_T_AS] = 1, [CTPU_K_T_SA] = 1,
    [CTPU_K_T_WHERE] = 3, [CTPU_K_T_CLAMP] = 1, [CTPU_K_T_COPY] = 1, [CTPU_K_T_FILL] = 0,
};

/* p->tape from p->ins (vm.h); n_tape stays 0 when an instruction does not map. */
static void vm_build_tape(ctpu_vm_prog *p)
{
    int16_t holder[CTPU_VM_MAX_REGS];
    int nt = 0, no = 0;
    for (int r = 0; r < CTPU_VM_MAX_REGS; r++) holder[r] = INT16_MIN;
    p->n_tape = p->n_out = 0;
    if (p->n_ext + p->n_reg > 127) return;
    for (int q = 0; q < p->n_ins; q++) {
        const ctpu_vm_ins *in = &p->ins[q];
        if (in->kind == CTPU_VM_LOAD) { holder[in->dst] = (int16_t)(-2 - in->a); continue; }
        if (in->kind == CTPU_VM_STORE) {   /* folded into its producer, the instruction before */
            if (nt == 0 || in->a < 0 || holder[in->a] != nt - 1 || p->tape[nt - 1].out >= 0 || no == CTPU_VM_MAX_NODES
                || (in->kop != CTPU_KDT_BF16 && in->kop != CTPU_KDT_F32))
                return;
            p->tape[nt - 1].out = (int8_t)no;
            p->out_slot[no] = in->scalar;
            p->out_ins[no] = -1;
            p->out_bf16[no++] = in->kop == CTPU_KDT_BF16;
            continue;
        }
        if (in->kind >= sizeof tape_kind || (in->kind != CTPU_VM_UNARY && tape_kind[in->kind] == 0) || in->dst < 0)
            return;
        ctpu_k_tape_ins T = { .kind = tape_kind[in->kind], .kop = in->kop, .round_bf16 = (in->flags & CTPU_VM_ROUND_BF16) != 0,
                              .a = -1, .b = -1, .c = -1, .dst = -1, .out = -1 };
        if (T.kind == CTPU_K_T_AS && (in->flags & CTPU_VM_SCALAR_FIRST)) T.kind = CTPU_K_T_SA;
        const int16_t regs[3] = { in->a, in->b, in->c };
        int8_t *srcs[3] = { &T.a, &T.b, &T.c };
        for (int k = 0; k < tape_nsrc[T.kind]; k++) {
            int v = tape_src(p, holder, regs[k], nt);
            if (v < -1) return;
            *srcs[k] = (int8_t)v;
        }
        if (in->flags & CTPU_VM_DIRECT) {
            if (no == CTPU_VM_MAX_NODES) return;
            T.out = (int8_t)no;
            p->out_slot[no] = in->scalar2;
            p->out_ins[no] = (int16_t)q;
            p->out_bf16[no++] = 0;
        }
        p->tape_ins[nt] = (int16_t)q;
        p->tape[nt] = T;
        holder[in->dst] = (int16_t)nt++;
    }
    p->n_tape = nt;
    p->n_out = no;
}

int ctpu_vm_build(ctpu_vm_prog *p, const ctpu_trace *t, const int *nodes, int count, const int32_t *slot_of,
                  const bool *store, const int32_t *scalar_base)
{
    /* value ids of the group's nodes */
    int nin = t->n_inputs;
    int32_t reg_of[CTPU_VM_MAX_NODES];
    int16_t ext_reg[CTPU_BCAST_MAX];
    int32_t ext_val[CTPU_BCAST_MAX];
    const ctpu_vtype *ext_types[CTPU_BCAST_MAX] = { 0 };
    int n_ext = 0;
    memset(p, 0, sizeof *p);
    p->shape = t->nodes[nodes[count - 1]].out;   /* the group's shape (small producers broadcast into it) */
    p->numel = ctpu_vtype_numel(&p->shape);
    /* last use (instruction position) of each group value and external, for register reuse */
    int last_use_node[CTPU_VM_MAX_NODES];
    int ext_last[CTPU_BCAST_MAX];
    for (int k = 0; k < count; k++) last_use_node[k] = -1;
    /* externals first pass */
    for (int k = 0; k < count; k++) {
        const ctpu_node *n = &t->nodes[nodes[k]];
        for (int j = 0; j < n->n_in; j++) {
            int32_t v = n->in[j];
            int in_group = -1;
            for (int q = 0; q < k; q++) if (nin + nodes[q] == v) in_group = q;
            if (in_group >= 0) { last_use_node[in_group] = k; continue; }
            int e = -1;
            for (int q = 0; q < n_ext; q++) if (ext_val[q] == v) e = q;
            if (e < 0) {
                if (n_ext == CTPU_BCAST_MAX) return -1;
                e = n_ext++;
                ext_val[e] = v;
                ext_types[e] = v < nin ? &t->in_type[v] : &t->nodes[v - nin].out;
                ext_reg[e] = -1;
            }
            ext_last[e] = k;
        }
    }
    p->n_ext = n_ext;
    for (int e = 0; e < n_ext; e++) {
        p->ext_slot[e] = slot_of[ext_val[e]];
        p->ext_dtype[e] = ext_types[e]->dtype;
    }
    ctpu_bcast_plan_make(&p->shape, ext_types, n_ext, &p->plan);

    /* instructions with a simple register allocator (free list) */
    bool busy[CTPU_VM_MAX_REGS] = { false };
    int n_reg = 0, ni = 0;
    ctpu_vm_ins *ins = p->ins;
#define ALLOC_REG(out) do { int r_ = -1; for (int q = 0; q < n_reg; q++) if (!busy[q]) { r_ = q; break; } \
        if (r_ < 0) { if (n_reg == CTPU_VM_MAX_REGS) return -1; r_ = n_reg++; } busy[r_] = true; (out) = r_; } while (0)
    for (int k = 0; k < count; k++) {
        const ctpu_node *n = &t->nodes[nodes[k]];
        int16_t src[3] = { -1, -1, -1 };
        for (int j = 0; j < n->n_in && j < 3; j++) {
            int32_t v = n->in[j];
            int q = -1;
            for (int g = 0; g < k; g++) if (nin + nodes[g] == v) q = g;
            if (q >= 0) { src[j] = (int16_t)reg_of[q]; continue; }
            int e = 0;
            while (ext_val[e] != v) e++;
            if (ext_reg[e] < 0) {
                int r;
                ALLOC_REG(r);
                ext_reg[e] = (int16_t)r;
                if (ni + 2 >= CTPU_VM_MAX_INS) return -1;
                ins[ni++] = (ctpu_vm_ins){ .kind = CTPU_VM_LOAD, .dst = (int16_t)r, .a = (int16_t)e };
            }
            src[j] = ext_reg[e];
        }
        /* free sources whose last use is here, then allocate dst (may reuse) */
        for (int e = 0; e < n_ext; e++)
            if (ext_reg[e] >= 0 && ext_last[e] == k) { busy[ext_reg[e]] = false; }
        for (int g = 0; g < k; g++)
            if (last_use_node[g] == k) busy[reg_of[g]] = false;
        int dst;
        ALLOC_REG(dst);
        reg_of[k] = dst;
        if (ni + 2 >= CTPU_VM_MAX_INS) return -1;
        ctpu_vm_ins I = { .dst = (int16_t)dst, .a = src[0], .b = src[1], .c = src[2], .kop = (uint8_t)ctpu_op_infos[n->op].kop };
        uint32_t kind = ctpu_op_infos[n->op].kind;
        if (kind & CTPU_OPK_UNARY) I.kind = CTPU_VM_UNARY;
        else if (kind & CTPU_OPK_BINARY) I.kind = CTPU_VM_BINARY;
        else if (kind & CTPU_OPK_SCALAR) {
            I.kind = CTPU_VM_SCALAR;
            I.scalar = scalar_base[nodes[k]];
            if (n->attr.flags & CTPU_ATTR_SCALAR_FIRST) I.flags |= CTPU_VM_SCALAR_FIRST;
        } else if (kind & CTPU_OPK_TERNARY) I.kind = CTPU_VM_WHERE;
        else if (ctpu_op_kop(n->op) == CTPU_K_E_CLAMP) { I.kind = CTPU_VM_CLAMP; I.scalar = scalar_base[nodes[k]]; }
        else if (n->op == CTPU_OP_FULL) { I.kind = CTPU_VM_FILL; I.scalar = scalar_base[nodes[k]]; }
        else I.kind = CTPU_VM_COPY; /* cast between float dtypes, expand, reshape */
        if (n->out.dtype == CTPU_KDT_BF16) I.flags |= CTPU_VM_ROUND_BF16;
        ins[ni++] = I;
        if (store[k] && n->out.dtype == CTPU_KDT_F32) {
            ins[ni - 1].flags |= CTPU_VM_DIRECT;
            ins[ni - 1].scalar2 = slot_of[nin + nodes[k]];
        } else if (store[k]) {
            ins[ni++] = (ctpu_vm_ins){ .kind = CTPU_VM_STORE, .dst = -1, .a = (int16_t)dst,
                                       .kop = n->out.dtype, .scalar = slot_of[nin + nodes[k]] };
        }
        if (last_use_node[k] < 0) busy[dst] = false;   /* not used later in the group */
    }
#undef ALLOC_REG
    p->n_ins = ni;
    p->n_reg = n_reg;
    vm_build_tape(p);
    return 0;
}

/* ------------------------------------------------------------ producer -> reduction */
typedef struct {
    const ctpu_vm_red_prog *p;
    ctpu_exec_ctx *ctx;
} vm_red_job;

/* Rows [r0, r1): each row's producer values are made one chunk at a time
 * (CTPU_K_RED_CHUNK elements, in L1), each chunk reduced in the kernels'
 * lane order, the chunk results combined by the kernels' pairwise tree: the
 * bits of the unfused reduction, without the producer's output in memory. */
static void vm_red_rows(const ctpu_vm_red_prog *p, ctpu_exec_ctx *ctx, int64_t r0, int64_t r1)
{
    int64_t n = p->n, nchunks = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    float *chunk = malloc(sizeof(float) * CTPU_K_RED_CHUNK);
    float *part = malloc(sizeof(float) * (size_t)(nchunks ? nchunks : 1));
    if (!chunk || !part) {
        free(chunk);
        free(part);
        ctx->fault_status = CTPU_ERR_OOM;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "fused program: out of host memory in a reduction");
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t s = r * n + c * CTPU_K_RED_CHUNK;
            int64_t len = n - c * CTPU_K_RED_CHUNK < CTPU_K_RED_CHUNK ? n - c * CTPU_K_RED_CHUNK : CTPU_K_RED_CHUNK;
            vm_range_to(&p->vm, ctx, s, s + len, p->red_slot, chunk);
            ctpu_k_reduce(p->op, chunk, 1, len, 1, &part[c], NULL);
        }
        float y = ctpu_k_reduce_chunks(p->op, part, nchunks);
        if (p->mean) ctpu_k_binary_scalar(CTPU_K_B_DIV, &y, (float)n, false, &y, 1);
        ctpu_from_f32(&y, p->out_dtype, (char *)ctx->ptr[p->out_slot] + (size_t)r * ctpu_kdt_size(p->out_dtype), 1);
    }
    free(chunk);
    free(part);
}

static void vm_red_task(void *arg, int tid, int nt)
{
    vm_red_job *j = arg;
    int64_t rows = j->p->outer;
    int64_t r0 = rows * tid / nt, r1 = rows * (tid + 1) / nt;
    if (r0 < r1) vm_red_rows(j->p, j->ctx, r0, r1);
}

/* inner > 1: each outer slice's producer values into a buffer [n, inner],
 * reduced by ctpu_k_reduce as exec_reduce would (the same columns, the same
 * order), divided by n for mean, rounded to the output dtype. */
static void vm_red_cols(const ctpu_vm_red_prog *p, ctpu_exec_ctx *ctx)
{
    int64_t n = p->n, inner = p->inner, slice = n * inner;
    float *x = malloc(sizeof(float) * (size_t)(slice ? slice : 1));
    float *y = malloc(sizeof(float) * (size_t)inner);
    if (!x || !y) {
        free(x);
        free(y);
        ctx->fault_status = CTPU_ERR_OOM;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "fused program: out of host memory in a reduction");
        return;
    }
    size_t es = ctpu_kdt_size(p->out_dtype);
    for (int64_t o = 0; o < p->outer; o++) {
        vm_range_to(&p->vm, ctx, o * slice, (o + 1) * slice, p->red_slot, x);
        ctpu_k_reduce(p->op, x, 1, n, inner, y, ctx->pool);
        if (p->mean) ctpu_k_binary_scalar(CTPU_K_B_DIV, y, (float)n, false, y, inner);
        ctpu_from_f32(y, p->out_dtype, (char *)ctx->ptr[p->out_slot] + (size_t)(o * inner) * es, inner);
    }
    free(x);
    free(y);
}

void ctpu_vm_red_exec(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_vm_red_prog *p = data;
    if (p->outer == 0) return;
    if (p->inner > 1) {
        vm_red_cols(p, ctx);
        return;
    }
    if (p->outer > 1 && p->outer * p->n >= (1 << 16) && ctx->pool && ctx->pool->nthreads > 1) {
        vm_red_job j = { p, ctx };
        ctx->pool->run(ctx->pool, vm_red_task, &j);
    } else {
        vm_red_rows(p, ctx, 0, p->outer);
    }
}
