/* The op table's data (the rows are in ops.h). Linked by eager, fuse and
 * device alike: it belongs to none of them. */
#include "ops.h"

const ctpu_op_info ctpu_op_infos[CTPU_OP_COUNT] = {
#define X(e, n, k, a, dt, sh, ko, fu, co, gr) \
    [CTPU_OP_##e] = { n, k, a, CTPU_DT_##dt, CTPU_SH_##sh, CTPU_FUSE_##fu, CTPU_CC_##co, CTPU_GRAD_##gr, ko },
    CTPU_OP_TABLE(X)
#undef X
};

/* Every new op updates this number (and adds its row, its conformance case in
 * tests/test_ops.c and its entries in the per-layer tables the tests check). */
_Static_assert(CTPU_OP_COUNT == 81, "an op was added or removed: update the count beside the table");
