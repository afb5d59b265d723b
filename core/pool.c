/* pool.c - the core's own threads: one parallel loop at a time, tasks
 * handed out in order by an atomic counter. This is all the threading the
 * core does; OpenBLAS runs single-threaded inside each task. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

struct attn_pool {
    int nthreads;          /* including the caller's thread */
    pthread_t *threads;    /* (nthreads - 1) */
    pthread_mutex_t mu;
    pthread_cond_t go;     /* a new loop (generation) or shutdown */
    pthread_cond_t done;   /* a helper finished its part of the loop */
    unsigned long gen;     /* loop generation, under mu */
    int busy;              /* helpers still in the current loop, under mu */
    int stop;              /* shut down, under mu */
    attn_task_fn fn;       /* current loop, under mu */
    void *arg;
    int ntasks;
    atomic_int next;       /* next task to hand out */
};

typedef struct {
    attn_pool *p;
    int tid;
} pool_slot;

static void run_tasks(attn_pool *p, attn_task_fn fn, void *arg, int ntasks, int tid)
{
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= ntasks) break;
        fn(arg, i, tid);
    }
}

static void *helper_main(void *a)
{
    pool_slot *slot = a;
    attn_pool *p = slot->p;
    int tid = slot->tid;
    free(slot);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        attn_task_fn fn = p->fn;
        void *arg = p->arg;
        int ntasks = p->ntasks;
        pthread_mutex_unlock(&p->mu);
        run_tasks(p, fn, arg, ntasks, tid);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->stop = 1;
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
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    p->busy = p->nthreads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, fn, arg, ntasks, 0);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
