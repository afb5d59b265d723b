/* pool.c - the core's own threads: one parallel loop at a time, tasks
 * handed out in order by an atomic counter. This is all the threading the
 * core does; OpenBLAS runs single-threaded inside each task.
 *
 * A forward runs three loops back to back (projections, attention, output
 * projection), so helpers spin for a short while before sleeping and the
 * caller spins before waiting: a futex wake-up on a virtual machine costs
 * tens of microseconds, which is most of a small forward. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

enum { SPIN_ROUNDS = 20000 }; /* pause instructions before sleeping: tens of microseconds */

struct attn_pool {
    int nthreads;          /* including the caller's thread */
    pthread_t *threads;    /* (nthreads - 1) */
    pthread_mutex_t mu;
    pthread_cond_t go;     /* a new loop (generation) or shutdown */
    pthread_cond_t done;   /* the last helper finished its part of the loop */
    atomic_ulong gen;      /* loop generation; bumped (release) after fn/arg/ntasks are set */
    atomic_int busy;       /* helpers still in the current loop */
    atomic_int stop;       /* shut down */
    attn_task_fn fn;       /* current loop: written before gen is bumped */
    void *arg;
    int ntasks;
    atomic_int next;       /* next task to hand out */
};

typedef struct {
    attn_pool *p;
    int tid;
} pool_slot;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_tasks(attn_pool *p, attn_task_fn fn, void *arg, int ntasks, int tid)
{
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= ntasks) break;
        fn(arg, i, tid);
    }
}

/* Waits until gen differs from seen or the pool stops; returns the new gen. */
static unsigned long wait_loop(attn_pool *p, unsigned long seen)
{
    unsigned long g = seen;
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (!atomic_load(&p->stop) && (g = atomic_load(&p->gen)) == seen)
        pthread_cond_wait(&p->go, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *helper_main(void *a)
{
    pool_slot *slot = a;
    attn_pool *p = slot->p;
    int tid = slot->tid;
    free(slot);
    unsigned long seen = 0;
    for (;;) {
        seen = wait_loop(p, seen);
        if (atomic_load(&p->stop)) break;
        run_tasks(p, p->fn, p->arg, p->ntasks, tid);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

attn_pool *attn_pool_new(int nthreads)
{
    if (nthreads < 1) nthreads = 1;
    attn_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nthreads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    if (nthreads > 1) {
        p->threads = calloc((size_t)nthreads - 1, sizeof *p->threads);
        if (!p->threads) goto fail;
        for (int t = 1; t < nthreads; t++) {
            pool_slot *slot = malloc(sizeof *slot);
            if (!slot) goto fail;
            slot->p = p;
            slot->tid = t;
            if (pthread_create(&p->threads[t - 1], NULL, helper_main, slot) != 0) {
                free(slot);
                goto fail;
            }
            p->nthreads = t + 1;
        }
    }
    return p;
fail:
    attn_pool_free(p);
    return NULL;
}

void attn_pool_free(attn_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->nthreads; t++) pthread_join(p->threads[t - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p);
}

void attn_pool_run(attn_pool *p, int ntasks, attn_task_fn fn, void *arg)
{
    if (ntasks <= 0) return;
    if (p->nthreads == 1 || ntasks == 1) {
        for (int i = 0; i < ntasks; i++) fn(arg, i, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, p->nthreads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, fn, arg, ntasks, 0);
    for (int i = 0; i < SPIN_ROUNDS && atomic_load_explicit(&p->busy, memory_order_acquire) > 0; i++)
        cpu_relax();
    if (atomic_load_explicit(&p->busy, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
