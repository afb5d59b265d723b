/* test_pool.c - Check suite for the core's compute pool (core/platform/pool.c), seen
 * through attn_ctx_parallel: every task of a loop runs exactly once, on a
 * thread index in range, and is done when the call returns; loops follow
 * each other for many generations with fewer, as many and more tasks than
 * threads, alternating two functions with their own arguments, so a helper
 * that ran a task of an older loop (or ran one twice, or late) shows up as
 * a count other than one. From 1 to 4 threads. Each task also writes a
 * plain (non-atomic) slot that the caller reads after the call: under
 * ThreadSanitizer (make tsan) that checks the pool's happens-before edges.
 * Each thread owns a share of a loop's tasks; a task that holds its thread
 * until every other task is done shows that no share waits for its owner.
 * A resting pool told that a loop is coming (attn_ctx_wake) wakes every
 * helper, from another thread too, and its loops then run as before.
 */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../core/attn.h"
#include "../core/platform/ctx.h"
#include "../core/platform/pool.h"
#include "check_run.h"

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

enum { GENERATIONS = 3000 };

/* One loop's record: how often each task ran, and on which thread. */
typedef struct {
    int ntasks;
    int nthreads;
    atomic_int *runs;      /* (ntasks) times task i ran */
    int *thread;           /* (ntasks) plain: 1 + the thread that ran it */
    atomic_int bad_thread; /* tasks that saw a thread index out of range */
    int which;             /* 0 or 1: the function this loop must run with */
    atomic_int wrong_fn;   /* tasks run by the other function */
} loop_rec;

static void record(loop_rec *l, int task, int thread, int which) {
    if (task < 0 || task >= l->ntasks) {
        atomic_fetch_add(&l->bad_thread, 1000); /* a task index out of range */
        return;
    }
    if (thread < 0 || thread >= l->nthreads) atomic_fetch_add(&l->bad_thread, 1);
    if (which != l->which) atomic_fetch_add(&l->wrong_fn, 1);
    atomic_fetch_add(&l->runs[task], 1);
    l->thread[task] = thread + 1;
}

static void task_a(void *arg, int task, int thread) {
    record(arg, task, thread, 0);
}

static void task_b(void *arg, int task, int thread) {
    record(arg, task, thread, 1);
}

/* The task counts a run cycles through for n threads: none, one, fewer,
 * as many and more than the threads, and many. */
static int tasks_for(int gen, int n) {
    int counts[] = {0, 1, n > 1 ? n - 1 : 1, n, n + 1, 2 * n + 1, 4 * n + 3, 64, 257};
    return counts[gen % (int)(sizeof counts / sizeof counts[0])];
}

static void check_loop(const loop_rec *l, int gen) {
    REQUIRE(atomic_load(&l->bad_thread) == 0, "generation %d: a thread or task index out of range",
            gen);
    REQUIRE(atomic_load(&l->wrong_fn) == 0,
            "generation %d: %d tasks ran with another loop's function", gen,
            atomic_load(&l->wrong_fn));
    for (int i = 0; i < l->ntasks; i++) {
        int r = atomic_load(&l->runs[i]);
        REQUIRE(r == 1, "generation %d (%d tasks, %d threads): task %d ran %d times", gen,
                l->ntasks, l->nthreads, i, r);
        REQUIRE(l->thread[i] >= 1 && l->thread[i] <= l->nthreads,
                "generation %d: task %d left thread slot %d", gen, i, l->thread[i]);
    }
}

START_TEST(test_every_task_once) {
    int nthreads = _i; /* 1 .. 4 */
    attn_ctx *ctx = attn_ctx_new(nthreads);
    ck_assert_ptr_nonnull(ctx);
    ck_assert_int_eq(attn_ctx_threads(ctx), nthreads);
    loop_rec *loops = calloc(GENERATIONS, sizeof *loops);
    ck_assert_ptr_nonnull(loops);
    long total = 0;
    for (int g = 0; g < GENERATIONS; g++) {
        loop_rec *l = &loops[g];
        l->ntasks = tasks_for(g, nthreads);
        l->nthreads = nthreads;
        l->which = g % 2;
        l->runs = calloc((size_t)l->ntasks + 1, sizeof *l->runs);
        l->thread = calloc((size_t)l->ntasks + 1, sizeof *l->thread);
        ck_assert(l->runs && l->thread);
        attn_ctx_parallel(ctx, l->ntasks, l->which ? task_b : task_a, l);
        check_loop(l, g); /* done when the call returns */
        total += l->ntasks;
    }
    attn_ctx_free(ctx);                     /* joins the helpers: nothing may run after this */
    for (int g = 0; g < GENERATIONS; g++) { /* no late or repeated run of an older loop */
        check_loop(&loops[g], g);
        free(loops[g].runs);
        free(loops[g].thread);
    }
    free(loops);
    printf("pool, %d threads: %ld tasks over %d loops, each once\n", nthreads, total, GENERATIONS);
}
END_TEST

/* A loop where one task, the first of the last thread's share, holds
 * whichever thread runs it until all the others are done (or 20 s pass). */
typedef struct {
    int ntasks, held;
    atomic_int done;     /* tasks finished, the held one aside */
    atomic_int timedout; /* the held task gave up */
} hold_loop;

static void hold_task(void *arg, int task, int thread) {
    (void)thread;
    hold_loop *h = arg;
    if (task != h->held) {
        atomic_fetch_add(&h->done, 1);
        return;
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(&h->done) < h->ntasks - 1) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 20) {
            atomic_store(&h->timedout, 1);
            return;
        }
        sched_yield();
    }
}

START_TEST(test_share_not_left_to_its_owner) {
    int nthreads = _i; /* 2 .. 4 */
    attn_ctx *ctx = attn_ctx_new(nthreads);
    ck_assert_ptr_nonnull(ctx);
    for (int n = nthreads; n <= 8 * nthreads; n += nthreads + 1)
        for (int rep = 0; rep < 20; rep++) {
            hold_loop h = {.ntasks = n, .held = (int)((long)(nthreads - 1) * n / nthreads)};
            attn_ctx_parallel(ctx, n, hold_task, &h);
            REQUIRE(!atomic_load(&h.timedout),
                    "%d threads, %d tasks: task %d waited 20 s for the others; %d of %d ran",
                    nthreads, n, h.held, atomic_load(&h.done), n - 1);
            REQUIRE(atomic_load(&h.done) == n - 1, "%d threads, %d tasks: %d of %d others ran",
                    nthreads, n, atomic_load(&h.done), n - 1);
        }
    attn_ctx_free(ctx);
}
END_TEST

/* Two contexts used from two threads at once do not share tasks. */
typedef struct {
    attn_ctx *ctx;
    int failures;
} side;

static void *side_main(void *arg) {
    side *s = arg;
    for (int g = 0; g < GENERATIONS / 3; g++) {
        int n = tasks_for(g, attn_ctx_threads(s->ctx));
        loop_rec l = {.ntasks = n, .nthreads = attn_ctx_threads(s->ctx), .which = g % 2};
        l.runs = calloc((size_t)n + 1, sizeof *l.runs);
        l.thread = calloc((size_t)n + 1, sizeof *l.thread);
        attn_ctx_parallel(s->ctx, n, l.which ? task_b : task_a, &l);
        for (int i = 0; i < n; i++)
            if (atomic_load(&l.runs[i]) != 1) s->failures++;
        if (atomic_load(&l.bad_thread) || atomic_load(&l.wrong_fn)) s->failures++;
        free(l.runs);
        free(l.thread);
    }
    return NULL;
}

START_TEST(test_two_contexts_apart) {
    side a = {attn_ctx_new(2), 0}, b = {attn_ctx_new(3), 0};
    ck_assert(a.ctx && b.ctx);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, side_main, &a), 0);
    side_main(&b);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.failures, 0);
    ck_assert_int_eq(b.failures, 0);
    attn_ctx_free(a.ctx);
    attn_ctx_free(b.ctx);
}
END_TEST

/* Polls until the pool has `sleeping` helpers asleep and at least `woken`
 * wake-ups (the pool's own counters), for up to 20 s; 1 when it got there. */
static int wait_counts(attn_ctx *ctx, int sleeping, unsigned woken) {
    for (int i = 0; i < 20000; i++) {
        int s;
        unsigned w;
        attn_pool_counts(attn_ctx_pool(ctx), &s, &w);
        if (s == sleeping && w >= woken) return 1;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return 0;
}

static void *wake_from_side(void *ctx) {
    attn_ctx_wake(ctx);
    return NULL;
}

/* A loop of one task per thread, each held until every thread has one: so
 * every helper has left its sleep for the loop before the loop ends. */
typedef struct {
    int nthreads;
    atomic_int arrived;
    atomic_int timedout;
} meet_loop;

static void meet_task(void *arg, int task, int thread) {
    (void)task;
    (void)thread;
    meet_loop *m = arg;
    atomic_fetch_add(&m->arrived, 1);
    for (int i = 0; i < 20000 && atomic_load(&m->arrived) < m->nthreads; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    if (atomic_load(&m->arrived) < m->nthreads) atomic_store(&m->timedout, 1);
}

START_TEST(test_wake_rouses_resting_helpers) {
    int nthreads = _i; /* 2 .. 4 */
    attn_ctx *ctx = attn_ctx_new(nthreads);
    ck_assert_ptr_nonnull(ctx);
    unsigned woken = 0;
    for (int round = 0; round < 3; round++) {
        meet_loop m = {.nthreads = nthreads};
        attn_ctx_parallel(ctx, nthreads, meet_task, &m);
        REQUIRE(!atomic_load(&m.timedout), "round %d: a helper never came to the loop", round);
        attn_ctx_rest(ctx);
        REQUIRE(wait_counts(ctx, nthreads - 1, woken), "round %d: the helpers never slept", round);
        if (round == 1) { /* from a thread that runs no loops, as a server's HTTP thread */
            pthread_t t;
            ck_assert_int_eq(pthread_create(&t, NULL, wake_from_side, ctx), 0);
            pthread_join(t, NULL);
        } else {
            attn_ctx_wake(ctx);
        }
        woken += (unsigned)nthreads - 1;
        int s;
        unsigned w;
        REQUIRE(wait_counts(ctx, nthreads - 1, woken), "round %d: %d helpers, woken %u times of %u",
                round, nthreads - 1, (attn_pool_counts(attn_ctx_pool(ctx), &s, &w), w), woken);
    }
    attn_ctx_free(ctx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_every_task_once, 1, 5);
    tcase_add_loop_test(tc, test_share_not_left_to_its_owner, 2, 5);
    tcase_add_test(tc, test_two_contexts_apart);
    tcase_add_loop_test(tc, test_wake_rouses_resting_helpers, 2, 5);
    suite_add_tcase(s, tc);
    return check_run(s);
}
