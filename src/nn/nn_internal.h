/* Helpers shared by the nn sources (public API only). */
#ifndef CTPU_NN_INTERNAL_H
#define CTPU_NN_INTERNAL_H

#include <stddef.h>
#include "ctpu.h"

/* Move t to no scope (parameters, optimizer state); returns t. */
ctpu_tensor ctpu__nn_global(ctpu_tensor t);
/* "f32[2,3]" */
const char *ctpu__nn_fmt(ctpu_tensor t, char *buf, size_t len);

#endif
