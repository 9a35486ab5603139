/* attention.c built with the avx512 flags of meson.build (its plain-C loops
 * vectorised 16 lanes wide): ctpu_k_attn_fwd_avx512, ctpu_k_attn_bwd_avx512. */
#define CTPU_ATTN_SFX avx512
#include "attention.c"
