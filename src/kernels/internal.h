/* Internal to src/kernels: per-family variant selection.
 * ctpu_kernels_set_isa() (isa.c) calls each family's select function once;
 * each family keeps its own function-pointer table (xxHash-style dispatch). */
#ifndef CTPU_KERNELS_INTERNAL_H
#define CTPU_KERNELS_INTERNAL_H
#include "kernels.h"

void ctpu_k_elementwise_select(ctpu_isa isa);   /* elementwise*.c, conversions */
void ctpu_k_reduce_select(ctpu_isa isa);        /* reduce*.c, softmax */
void ctpu_k_mxu_select(ctpu_isa isa);           /* mxu*.c */
bool ctpu_k_cpu_has(ctpu_isa isa);              /* isa.c */

#endif
