/* The differential fuzzer from the command line:
 *   fuzz [--seed S] [--count N] [--max-ops M] [--no-autograd] [--valid-only]
 * Programs S .. S+N-1 (each a forked child run; a crash or a difference is
 * minimised and printed as a C test on stdout). Exit 1 if any failed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fz.h"

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    int count = 1000;
    fz_opts o = { .max_ins = 40, .autograd = true, .invalid = true };
    static const struct option longopts[] = {
        { "seed", required_argument, NULL, 's' },    { "count", required_argument, NULL, 'n' },
        { "max-ops", required_argument, NULL, 'm' }, { "no-autograd", no_argument, NULL, 'A' },
        { "valid-only", no_argument, NULL, 'V' },    { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    /* getopt_long: --seed S or --seed=S */
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'n': count = atoi(optarg); break;
        case 'm': o.max_ins = atoi(optarg); break;
        case 'A': o.autograd = false; break;
        case 'V': o.invalid = false; break;
        case 'h':
            printf("usage: %s [--seed S] [--count N] [--max-ops M] [--no-autograd] [--valid-only]\n", argv[0]);
            return 0;
        default:
            fprintf(stderr, "usage: %s [--seed S] [--count N] [--max-ops M] [--no-autograd] [--valid-only]\n", argv[0]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument %s\n", argv[0], argv[optind]);
        return 2;
    }
    if (o.max_ins < 1 || o.max_ins > FZ_MAX_INS) o.max_ins = FZ_MAX_INS;
    int ran = 0, skipped = 0;
    int failures = fz_campaign(seed, count, &o, stdout, &ran, &skipped);
    printf("fuzz: %d programs from seed %llu: %d failing, %d skipped (resource errors)\n", ran,
           (unsigned long long)seed, failures, skipped);
    return failures ? 1 : 0;
}
