/* A minimal ctpu_k_pool for kernel tests: spawns nt-1 pthreads per run. */
#ifndef CTPU_TEST_K_POOL_H
#define CTPU_TEST_K_POOL_H
#include <pthread.h>
#include "kernels.h"

typedef struct { void (*fn)(void *, int, int); void *ctx; int tid, nt; } k_pool_job;

static void *k_pool_thread(void *p)
{
    k_pool_job *j = p;
    j->fn(j->ctx, j->tid, j->nt);
    return NULL;
}

static void k_pool_run(ctpu_k_pool *pool, void (*fn)(void *, int, int), void *ctx)
{
    int nt = pool->nthreads;
    pthread_t th[64];
    k_pool_job jobs[64];
    for (int t = 1; t < nt; t++) {
        jobs[t] = (k_pool_job){ fn, ctx, t, nt };
        pthread_create(&th[t], NULL, k_pool_thread, &jobs[t]);
    }
    fn(ctx, 0, nt);
    for (int t = 1; t < nt; t++) pthread_join(th[t], NULL);
}

static inline ctpu_k_pool k_pool_make(int nt)
{
    return (ctpu_k_pool){ .nthreads = nt < 1 ? 1 : (nt > 64 ? 64 : nt), .run = k_pool_run, .impl = NULL };
}
#endif
