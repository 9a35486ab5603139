/* Canonical key of a trace (DESIGN.md "Key"): a byte encoding hashed with
 * XXH3-64; a hit compares the full encoding, never the hash alone. */
#include <string.h>
#include <xxhash.h>

#include "fuse.h"

typedef struct { uint8_t *p, *end; bool ok; } wbuf;

static inline void put(wbuf *w, const void *src, size_t n)
{
    if ((size_t)(w->end - w->p) < n) { w->ok = false; return; }
    memcpy(w->p, src, n);
    w->p += n;
}

static inline void put_vtype(wbuf *w, const ctpu_vtype *v)
{
    uint8_t h[2] = { v->dtype, v->ndim };
    put(w, h, 2);
    put(w, v->shape, sizeof(int64_t) * v->ndim);
}

size_t ctpu_trace_key(const ctpu_trace *t, uint8_t *buf, size_t cap)
{
    wbuf w = { buf, buf + cap, true };
    uint32_t hdr[4] = { (uint32_t)t->n_inputs, (uint32_t)t->n_nodes, (uint32_t)t->n_outputs,
                        (uint32_t)t->precision | ((uint32_t)t->debug_checks << 8) };
    put(&w, hdr, sizeof hdr);
    for (int i = 0; i < t->n_inputs; i++) put_vtype(&w, &t->in_type[i]);
    static const ctpu_attrs zero_attrs;
    for (int i = 0; i < t->n_nodes; i++) {
        const ctpu_node *n = &t->nodes[i];
        /* attrs are written only when set (most elementwise nodes have none) */
        bool has_attr = memcmp(&n->attr, &zero_attrs, sizeof zero_attrs) != 0;
        uint8_t h[4] = { (uint8_t)(n->op & 0xff), (uint8_t)(n->op >> 8), (uint8_t)(n->n_in | (has_attr << 7)),
                         n->n_scalars };
        put(&w, h, sizeof h);
        put(&w, n->in, sizeof(int32_t) * n->n_in);
        put_vtype(&w, &n->out);
        if (has_attr) put(&w, &n->attr, sizeof n->attr);
    }
    put(&w, t->outputs, sizeof(int32_t) * (size_t)t->n_outputs);
    if (t->out_alias) put(&w, t->out_alias, sizeof(int32_t) * (size_t)t->n_outputs);
    return w.ok ? (size_t)(w.p - buf) : 0;
}

uint64_t ctpu_key_hash(const uint8_t *key, size_t len) { return XXH3_64bits(key, len); }
