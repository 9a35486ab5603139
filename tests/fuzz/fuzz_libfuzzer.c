/* libFuzzer entry point over the same generator: the input bytes are the
 * generator's choices. A difference between the modes aborts (libFuzzer
 * saves the input); crashes and sanitizer reports are caught by libFuzzer.
 * Build: meson configure -Dlibfuzzer=true with CC=clang; run
 *   ./tests/fuzz/fuzz_libfuzzer -max_total_time=60 */
#include <stdio.h>
#include <stdlib.h>

#include "fz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool up;
    if (!up) {
        if (ctpu_init() != CTPU_OK) { fprintf(stderr, "init: %s\n", ctpu_last_error()); abort(); }
        up = true;
    }
    fz_rng r;
    fz_rng_bytes(&r, data, size);
    fz_opts o = { .max_ins = 24, .autograd = true, .invalid = true };
    fz_prog p;
    fz_generate(&r, &o, &p, NULL);
    char why[512];
    bool skipped;
    if (!fz_check(&p, why, sizeof why, &skipped)) {
        fprintf(stderr, "fuzz: modes differ: %s\n", why);
        fz_print_c(&p, "fuzz_case", stderr);
        abort();
    }
    return 0;
}
