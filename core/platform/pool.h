/* pool.h - a fixed set of threads that run one parallel loop at a time
 * (pool.c). The caller's thread takes part as tid 0; with one thread
 * nothing is spawned.
 */
#ifndef ATTN_PLATFORM_POOL_H
#define ATTN_PLATFORM_POOL_H

typedef struct attn_pool attn_pool;
typedef void (*attn_task_fn)(void *arg, int task, int tid);

attn_pool *attn_pool_new(int nthreads);
void attn_pool_free(attn_pool *p);
/* Runs fn(arg, i, tid) for every i in [0, ntasks) and returns when all
 * are done. Thread t runs its own contiguous share [t n / P, (t+1) n / P)
 * first, in order, then helps with the others' (pool.c): the same share
 * of every loop of n tasks, so that tasks ordered alike in two loops run
 * on the same thread. */
void attn_pool_run(attn_pool *p, int ntasks, attn_task_fn fn, void *arg);
/* No loop is coming soon: helpers stop spinning and sleep until the next
 * attn_pool_run (which ends the rest). */
void attn_pool_rest(attn_pool *p);
/* A loop is coming soon (any thread may say so): resting helpers wake and
 * spin for it, up to a millisecond, then sleep again. No-op unless resting. */
void attn_pool_wake(attn_pool *p);
/* Tests: helpers asleep now, and how often one woke for attn_pool_wake. */
void attn_pool_counts(attn_pool *p, int *sleeping, unsigned *woken);
/* Pins the calling thread (the one that runs the loops) to cpus[0] and
 * helper t to cpus[t % n]. Returns 0, or an errno value. */
int attn_pool_bind(attn_pool *p, const int *cpus, int n);

#endif
