/* Autograd: reverse mode on a tape. Until requires-grad exists, nothing is
 * recorded. */
#include "eager.h"

void ctpu__ag_record(const ctpu_node *node, const ctpu_tensor *inputs, const double *scalars, ctpu_tensor out)
{
    (void)node; (void)inputs; (void)scalars; (void)out;
}

void ctpu__ag_release(ctpu_trec *rec) { rec->ag = NULL; }
