/* attention.c built with the avx2 flags of meson.build (its plain-C loops
 * vectorised 8 lanes wide): ctpu_k_attn_fwd_avx2, ctpu_k_attn_bwd_avx2. */
#define CTPU_ATTN_SFX avx2
#include "attention.c"
