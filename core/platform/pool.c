/* pool.c - the core's own threads: one parallel loop at a time, the only
 * threading the core does (OpenBLAS runs single-threaded inside a task).
 *
 * Thread t owns the contiguous share [t n / P, (t+1) n / P) of a loop of n
 * tasks, runs it in order, then takes what is left of the others', so
 * loops ordered alike run on the same threads (the output projection reads
 * what the same thread's attention wrote). A loop is done when its tasks
 * are: a helper the OS has not scheduled delays nothing; each share's next
 * task and the loop's generation share one 64-bit word, so a late helper
 * never claims a newer loop's task. Helpers spin a bounded time between
 * loops (a futex wake-up on a virtual machine costs most of a small
 * forward), stop at once on attn_pool_rest, and wake early on
 * attn_pool_wake (docs/performance.md, "A lone request after a pause").
 * Which thread runs a task never changes a bit of its output.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "pool.h"

enum {
    SPIN_NS = 30000,        /* longest spin before sleeping: covers the gaps inside a batch */
    SPIN_CHECK = 64,        /* pause instructions between two looks at the clock */
    WAKE_SPIN_NS = 1000000, /* longest spin after attn_pool_wake: a batcher's wake-up and packing */
};

/* One thread's share of the current loop: gen << 32 | its next task. A
 * cache line each: the owner claims from it at every task. */
typedef struct {
    _Alignas(64) atomic_uint_least64_t next;
} pool_share;

struct attn_pool {
    int nthreads;       /* including the caller's thread */
    pthread_t *threads; /* (nthreads - 1) */
    pthread_mutex_t mu;
    pthread_cond_t go;        /* a new loop (generation) or shutdown */
    pthread_cond_t done;      /* the current loop's last task finished */
    atomic_uint gen;          /* loop generation; bumped (release) once the loop is set */
    pool_share *shares;       /* (nthreads) */
    _Atomic(attn_task_fn) fn; /* current loop, written before gen is bumped */
    _Atomic(void *) arg;
    atomic_int ntasks;
    atomic_int finished; /* tasks of the current loop done */
    atomic_int stop;     /* shut down */
    atomic_int resting;  /* 1: no loop is coming soon, helpers sleep instead of spinning */
    atomic_uint wakes;   /* attn_pool_wake calls that found the pool resting */
    atomic_int sleeping; /* helpers waiting on go (for the tests) */
    atomic_uint woken;   /* times a helper left go for a wake, not a loop (for the tests) */
};

typedef struct {
    attn_pool *p;
    int tid;
} pool_slot;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Spins until done(p, x) holds, the pool rests (when `restless`), or
 * spin_ns pass; returns done's last answer. */
static int spin_until(attn_pool *p, int (*done)(attn_pool *, unsigned), unsigned x, int restless,
                      uint64_t spin_ns) {
    uint64_t until = 0;
    for (;;) {
        for (int i = 0; i < SPIN_CHECK; i++) {
            if (done(p, x)) return 1;
            if (restless && atomic_load_explicit(&p->resting, memory_order_relaxed)) return 0;
            cpu_relax();
        }
        uint64_t t = now_ns();
        if (!until)
            until = t + spin_ns;
        else if (t >= until)
            return 0;
    }
}

/* The first task of thread t's share of n tasks on P threads. */
static int share_start(int t, int n, int P) {
    return (int)((int64_t)t * n / P);
}

/* Claims and runs the tasks of loop `gen` left in share u, up to end;
 * returns how many it ran. */
static int run_share(attn_pool *p, int u, int end, unsigned gen, attn_task_fn fn, void *arg,
                     int tid) {
    atomic_uint_least64_t *next = &p->shares[u].next;
    int ran = 0;
    uint64_t v = atomic_load_explicit(next, memory_order_acquire);
    for (;;) {
        if ((unsigned)(v >> 32) != gen || (int)(uint32_t)v >= end) break;
        if (!atomic_compare_exchange_weak_explicit(next, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* v reloaded */
        fn(arg, (int)(uint32_t)v, tid);
        ran++;
        v = atomic_load_explicit(next, memory_order_acquire);
    }
    return ran;
}

/* Runs tasks of loop `gen`: thread tid's own share, then what is left of
 * the others'; returns how many this thread ran. */
static int run_tasks(attn_pool *p, unsigned gen, int tid) {
    /* acquire: a helper still on an older loop that reads any of these from
     * a newer loop then reads the newer loop's claim words below, and stops */
    attn_task_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
    void *arg = atomic_load_explicit(&p->arg, memory_order_acquire);
    int ntasks = atomic_load_explicit(&p->ntasks, memory_order_acquire);
    int P = p->nthreads, ran = 0;
    for (int i = 0; i < P; i++) {
        int u = (tid + i) % P;
        ran += run_share(p, u, share_start(u + 1, ntasks, P), gen, fn, arg, tid);
    }
    return ran;
}

/* Counts n finished tasks; the last one wakes the caller. */
static void finish(attn_pool *p, int n) {
    if (n == 0) return;
    int total = atomic_load_explicit(&p->ntasks, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&p->finished, n, memory_order_acq_rel) + n == total) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

static int new_loop(attn_pool *p, unsigned seen) {
    return atomic_load_explicit(&p->gen, memory_order_acquire) != seen ||
           atomic_load_explicit(&p->stop, memory_order_relaxed);
}

static int loop_done(attn_pool *p, unsigned ntasks) {
    return (unsigned)atomic_load_explicit(&p->finished, memory_order_acquire) == ntasks;
}

/* Waits until gen differs from seen or the pool stops; returns the new
 * gen. Sleeps after SPIN_NS; woken by attn_pool_wake, spins again. */
static unsigned wait_loop(attn_pool *p, unsigned seen) {
    unsigned g = seen;
    if (spin_until(p, new_loop, seen, 1, SPIN_NS))
        return atomic_load_explicit(&p->gen, memory_order_acquire);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        unsigned w = atomic_load(&p->wakes);
        atomic_fetch_add(&p->sleeping, 1);
        while (!atomic_load(&p->stop) && (g = atomic_load(&p->gen)) == seen &&
               atomic_load(&p->wakes) == w)
            pthread_cond_wait(&p->go, &p->mu);
        atomic_fetch_sub(&p->sleeping, 1);
        pthread_mutex_unlock(&p->mu);
        if (g != seen || atomic_load(&p->stop)) return g;
        atomic_fetch_add(&p->woken, 1);
        if (spin_until(p, new_loop, seen, 1, WAKE_SPIN_NS))
            return atomic_load_explicit(&p->gen, memory_order_acquire);
    }
}

static void *helper_main(void *a) {
    pool_slot *slot = a;
    attn_pool *p = slot->p;
    int tid = slot->tid;
    free(slot);
    pthread_setname_np(pthread_self(), "attn-pool"); /* as ps -T and /proc show it */
    unsigned seen = 0;
    for (;;) {
        seen = wait_loop(p, seen);
        if (atomic_load(&p->stop)) break;
        finish(p, run_tasks(p, seen, tid));
    }
    return NULL;
}

attn_pool *attn_pool_new(int nthreads) {
    if (nthreads < 1) nthreads = 1;
    attn_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nthreads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    p->shares = aligned_alloc(64, sizeof(pool_share) * (size_t)nthreads);
    if (!p->shares) {
        free(p);
        return NULL;
    }
    for (int t = 0; t < nthreads; t++)
        atomic_init(&p->shares[t].next, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->arg, NULL);
    atomic_init(&p->ntasks, 0);
    atomic_init(&p->finished, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->resting, 1);
    atomic_init(&p->wakes, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->woken, 0);
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

void attn_pool_free(attn_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->nthreads; t++)
        pthread_join(p->threads[t - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->shares);
    free(p);
}

void attn_pool_run(attn_pool *p, int ntasks, attn_task_fn fn, void *arg) {
    if (ntasks <= 0) return;
    if (p->nthreads == 1 || ntasks == 1) {
        for (int i = 0; i < ntasks; i++)
            fn(arg, i, 0);
        return;
    }
    atomic_store_explicit(&p->resting, 0, memory_order_relaxed);
    unsigned gen = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    /* The claim words first: a helper still holding the previous generation
     * could otherwise pair an exhausted claim word with this loop's larger
     * ntasks, and run this loop's fn on a task before the loop is set. */
    for (int t = 0; t < p->nthreads; t++)
        atomic_store_explicit(&p->shares[t].next,
                              (uint64_t)gen << 32 | (uint32_t)share_start(t, ntasks, p->nthreads),
                              memory_order_relaxed);
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    atomic_store_explicit(&p->fn, fn, memory_order_release);
    atomic_store_explicit(&p->arg, arg, memory_order_release);
    atomic_store_explicit(&p->ntasks, ntasks, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->gen, gen, memory_order_release);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    finish(p, run_tasks(p, gen, 0));
    if (spin_until(p, loop_done, (unsigned)ntasks, 0, SPIN_NS)) return;
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->finished) < ntasks)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* Pins one thread to one CPU: 0, or an errno. */
static int pin(pthread_t t, int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return EINVAL;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return pthread_setaffinity_np(t, sizeof one, &one);
}

int attn_pool_bind(attn_pool *p, const int *cpus, int n) {
    if (n < 1 || !cpus) return EINVAL;
    int rc = pin(pthread_self(), cpus[0]);
    for (int t = 1; t < p->nthreads && rc == 0; t++)
        rc = pin(p->threads[t - 1], cpus[t % n]);
    return rc;
}

void attn_pool_rest(attn_pool *p) {
    atomic_store_explicit(&p->resting, 1, memory_order_relaxed);
}

void attn_pool_wake(attn_pool *p) {
    if (p->nthreads == 1 || !atomic_exchange_explicit(&p->resting, 0, memory_order_relaxed)) return;
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->wakes, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
}

void attn_pool_counts(attn_pool *p, int *sleeping, unsigned *woken) {
    *sleeping = atomic_load(&p->sleeping);
    *woken = atomic_load(&p->woken);
}
