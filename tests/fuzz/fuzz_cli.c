/* The differential fuzzer from the command line:
 *   fuzz [--seed S] [--count N] [--max-ops M] [--no-autograd] [--valid-only]
 * Programs S .. S+N-1 (each a forked child run; a crash or a difference is
 * minimised and printed as a C test on stdout). Exit 1 if any failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fz.h"

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    int count = 1000;
    fz_opts o = { .max_ins = 40, .autograd = true, .invalid = true };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-ops") && i + 1 < argc) o.max_ins = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-autograd")) o.autograd = false;
        else if (!strcmp(argv[i], "--valid-only")) o.invalid = false;
        else {
            fprintf(stderr, "usage: %s [--seed S] [--count N] [--max-ops M] [--no-autograd] [--valid-only]\n", argv[0]);
            return 2;
        }
    }
    if (o.max_ins < 1 || o.max_ins > FZ_MAX_INS) o.max_ins = FZ_MAX_INS;
    int ran = 0, skipped = 0;
    int failures = fz_campaign(seed, count, &o, stdout, &ran, &skipped);
    printf("fuzz: %d programs from seed %llu: %d failing, %d skipped (resource errors)\n", ran,
           (unsigned long long)seed, failures, skipped);
    return failures ? 1 : 0;
}
