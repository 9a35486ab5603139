/* The README's example (tests/check_docs.py keeps the two identical):
 * y = relu(x @ w - 4); prints sum(y) and the mode. */
#include <ctpu.h>
#include <stdio.h>

int main(void)
{
    if (ctpu_init() != CTPU_OK) { fprintf(stderr, "%s\n", ctpu_last_error()); return 1; }
    float xa[6] = {1, 2, 3, 4, 5, 6}, wa[6] = {1, 0, 0, 1, 1, 1};
    int64_t xs[2] = {2, 3}, ws[2] = {3, 2};
    ctpu_scope_begin();                                  /* handles made now die at scope end */
    ctpu_tensor x = ctpu_from_host(xa, CTPU_F32, 2, xs);
    ctpu_tensor w = ctpu_from_host(wa, CTPU_F32, 2, ws);
    ctpu_tensor y = ctpu_relu(ctpu_add_scalar(ctpu_matmul(x, w), -4.0));
    ctpu_tensor s = ctpu_sum(y, 0, NULL, false);         /* all dims */
    double v;
    if (ctpu_item(s, &v) != CTPU_OK) { fprintf(stderr, "%s\n", ctpu_last_error()); return 1; }
    printf("sum = %g (mode %s)\n", v, ctpu_mode_name(ctpu_get_mode()));   /* sum = 14 (mode strict) */
    ctpu_scope_end();
    ctpu_shutdown();
    return 0;
}
