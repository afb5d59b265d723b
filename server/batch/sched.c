/* sched.c - model queues, the batcher, and the deadline/hang-up sweeper.
 * See sched.h.
 *
 * One batcher thread owns the process's one compute pool (an attn_ctx of
 * cfg->compute_threads threads: the batcher's own and its helpers). As soon
 * as compute is free and a queue holds work it takes a batch, up to the
 * token and request caps (continuous batching: requests that arrive while
 * a batch computes form the next one), drops those whose client left, and
 * runs the rest through the pipeline (pipeline.c: pack, compute, answer,
 * every step over the whole pool).
 */
#include "sched.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/buffer.h"
#include "../base/clock.h"
#include "../base/cpus.h"
#include "../obs/log.h"
#include "../obs/prom.h"
#include "pipeline.h"

/* How often the sweeper asks whether queued requests' clients left. */
#define HANGUP_POLL_US 20000

typedef struct {
    attnd_req *head, *tail; /* FIFO, oldest first */
    int count;              /* requests queued */
    long long tokens;       /* their tokens */
} squeue;

/* The batcher's arrays, one entry per request of a batch. */
typedef struct {
    attnd_req **batch;   /* (max_batch_requests) the batch being run */
    attnd_req **expired; /* (max_batch_requests) met past their deadline */
    char *left;          /* (max_batch_requests) 1: batch[i]'s client left */
} scratch;

/* Locking: one mutex guards every queue and every attnd_req's scheduling
 * fields. The batcher and the sweeper take requests out under it and
 * answer them outside it. finish() is never called with the mutex held;
 * departed() is asked with it held by the sweeper, without it by the
 * batcher.
 *
 * No HTTP in here: a request is a job, an answer a reply of some kind
 * (base/reply.h), whose status is the HTTP side's to derive; whether a
 * client left is the HTTP side's to say (attnd_sched_opts.departed).
 */
struct attnd_sched {
    attnd_sched_opts o;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* the batcher waits for work */
    pthread_cond_t sweep_cv; /* the sweeper waits for deadlines */
    squeue *q;               /* (nq) one per model slot (models/registry.h), grown as models
                                are added; a request's job.model is its index */
    int nq;
    int rr;               /* queue the next pick starts at (fairness) */
    int running;          /* requests taken by the batcher, not yet answered */
    int draining;         /* 1: no waiting for company */
    int stop;             /* 1: the batcher exits once the queues are empty */
    int sweep_stop;       /* 1: the sweeper exits */
    uint64_t sweep_wake;  /* when the sleeping sweeper wakes next (monotonic us) */
    attn_ctx *ctx;        /* the one compute pool; used by the batcher only (and woken by
                             attnd_sched_submit) */
    attnd_pipeline *pipe; /* the batcher's road for every batch, on ctx */
    scratch w;            /* the batcher's */
    pthread_t batcher;
    int batcher_started;
    pthread_t sweeper;
    int sweeper_started;
    int stopped; /* 1 after attnd_sched_stop (main thread only) */
};

/* ---- queues (mutex held) ---- */

static void q_push(squeue *q, attnd_req *r) {
    r->prev = q->tail;
    r->next = NULL;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->count++;
    q->tokens += r->tokens;
}

static void q_remove(squeue *q, attnd_req *r) {
    if (r->prev)
        r->prev->next = r->next;
    else
        q->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        q->tail = r->prev;
    r->prev = r->next = NULL;
    q->count--;
    q->tokens -= r->tokens;
}

/* ---- answering ---- */

/* Hands r to the HTTP side, refused with e when e is not NULL (else its
 * reply is written, or its client left), and drops the scheduler's
 * reference. A session step not yet ended is dropped first, so that the
 * session's next step finds it free. */
static void deliver(attnd_sched *s, attnd_req *r, const attnd_error *e) {
    if (e) attnd_reply_error(&r->reply, e);
    attnd_req_end_step(r, 0);
    pthread_mutex_lock(&s->mu);
    int cancelled = r->cancelled;
    r->state = RQ_DONE;
    pthread_mutex_unlock(&s->mu);
    if (!cancelled) s->o.finish(r, s->o.finish_arg);
    attnd_req_unref(r);
}

/* r's deadline passed before it was answered. */
static void answer_timeout(attnd_sched *s, attnd_req *r) {
    attnd_req_timeout(r);
    deliver(s, r, NULL);
}

/* Asks the HTTP side which of rs[0..n) lost their client (left[i] = 1). */
static void find_departed(attnd_sched *s, attnd_req *const *rs, int n, char *left) {
    memset(left, 0, (size_t)n);
    if (s->o.departed && n > 0) s->o.departed(rs, n, left, s->o.departed_arg);
}

/* ---- the batcher ---- */

/* Clients that left since the sweeper last looked are dropped here; the
 * rest move to the front of rs. Returns how many remain. */
static int drop_departed(attnd_sched *s, attnd_req **rs, int n) {
    find_departed(s, rs, n, s->w.left);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (s->w.left[i]) {
            deliver(s, rs[i], NULL);
        } else {
            rs[kept++] = rs[i];
        }
    }
    return kept;
}

/* The pipeline answered r: to the HTTP side. */
static void pipeline_answered(void *arg, attnd_req *r) {
    deliver(arg, r, NULL);
}

/* The batch's requests are answered: they no longer count as running. */
static void release(attnd_sched *s, int taken) {
    pthread_mutex_lock(&s->mu);
    s->running -= taken;
    pthread_mutex_unlock(&s->mu);
}

/* Drops the departed, then packs, computes and answers one batch of
 * requests of one model (pipeline.c). */
static void run_batch(attnd_sched *s, attnd_req **rs, int taken) {
    int n = drop_departed(s, rs, taken);
    if (n > 0) {
        attnd_version *v = rs[0]->job.ver; /* every request of a batch is on it: take() */
        attnd_pipeline_run(s->pipe, &v->model, &v->info, s->o.metrics, rs, n, pipeline_answered, s);
    }
    release(s, taken);
}

/* 1 when r may join a batch that holds a session step already (steps) or
 * a cross-attention request (cross): a step's cache rides in a batch
 * whose every sequence is self-attention (pipeline.h). */
static int joins(const attnd_req *r, int steps, int cross) {
    return r->step.table ? !cross : r->job.self || !steps;
}

/* Takes a batch out of queue q, oldest first (mutex held), up to cap
 * requests and the batch token limit, stopping at the first that cannot
 * join it; requests past their deadline go to expired instead. Returns the
 * batch size. */
static int take(attnd_sched *s, squeue *q, attnd_req **batch, int cap, attnd_req **expired,
                int *nexp, uint64_t now) {
    int n = 0, steps = 0, cross = 0;
    long long tokens = 0;
    while (q->head && n < cap && *nexp < cap) {
        attnd_req *r = q->head;
        if (n > 0 && tokens + r->tokens > s->o.cfg->max_batch_tokens) break;
        if (!joins(r, steps, cross)) break;
        if (n > 0 && r->job.ver != batch[0]->job.ver) break; /* a batch never mixes versions */
        q_remove(q, r);
        if (now >= r->deadline_us) {
            expired[(*nexp)++] = r;
            continue;
        }
        r->state = RQ_RUNNING;
        batch[n++] = r;
        tokens += r->tokens;
        steps |= r->step.table != NULL;
        cross |= !r->job.self;
    }
    return n;
}

/* Takes a batch from the first ready queue (mutex held). Expired requests
 * met on the way go to *expired. Returns the batch size, 0 when nothing is
 * ready; *wake is when the earliest waiting queue becomes ready. */
static int pick(attnd_sched *s, attnd_req **batch, int cap, attnd_req **expired, int *nexp,
                uint64_t *wake) {
    const attnd_config *c = s->o.cfg;
    uint64_t now = attnd_mono_us();
    *wake = UINT64_MAX;
    for (int t = 0; t < s->nq; t++) {
        int qi = (s->rr + t) % s->nq;
        squeue *q = &s->q[qi];
        if (!q->count) continue;
        uint64_t ready_at = q->head->t_admit_us + (uint64_t)c->max_queue_delay_us;
        int ready = s->draining || s->stop || q->count >= c->max_batch_requests ||
                    q->tokens >= c->max_batch_tokens || now >= ready_at;
        if (!ready) {
            if (ready_at < *wake) *wake = ready_at;
            continue;
        }
        int n = take(s, q, batch, cap, expired, nexp, now);
        s->running += n;
        s->rr = (qi + 1) % s->nq;
        if (n || *nexp) return n;
    }
    return 0;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t until_mono_us) {
    if (until_mono_us == UINT64_MAX) {
        pthread_cond_wait(cv, mu);
        return;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)(until_mono_us / 1000000u);
    ts.tv_nsec = (long)(until_mono_us % 1000000u) * 1000;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* The batcher: takes a batch as soon as compute is free and one is ready,
 * runs it on the pool, and sleeps only when every queue is empty (or
 * waiting out max_queue_delay_us). */
/* Pins the pool's threads, the batcher's own first, one CPU each of the
 * affinity mask (workers.pin_threads; attn_ctx_bind says why). A failure
 * is logged and leaves them unpinned. */
static void pin_pool(attnd_sched *s) {
    int cpus[1024], n = attnd_cpus_list(cpus, (int)countof(cpus));
    char err[160];
    if (n > 0 && attn_ctx_bind(s->ctx, cpus, n, err, sizeof(err)) == 0) return;
    attnd_log(LOG_WARN, "%s",
              n > 0 ? err : "cannot read the affinity mask to pin the compute threads");
}

static void *batcher_main(void *arg) {
    attnd_sched *s = arg;
    int cap = s->o.cfg->max_batch_requests;
    pthread_setname_np(pthread_self(), "attnd-batcher"); /* the pool's thread 0 too */
    if (s->o.cfg->pin) pin_pool(s);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        uint64_t wake;
        int nexp = 0;
        int n = pick(s, s->w.batch, cap, s->w.expired, &nexp, &wake);
        if (n == 0 && nexp == 0) {
            int queued = 0;
            for (int i = 0; i < s->nq; i++)
                queued += s->q[i].count;
            if (s->stop && queued == 0) break;
            attn_ctx_rest(s->ctx); /* nothing to compute: the pool's threads sleep */
            timed_wait(&s->work_cv, &s->mu, wake);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < nexp; i++)
            answer_timeout(s, s->w.expired[i]);
        if (n) run_batch(s, s->w.batch, n);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- the sweeper ---- */

/* The sweeper's grow-only buffers: what one sweep takes out of the queues
 * and the requests it asks about. */
typedef struct {
    size_t cap;        /* entries of each array */
    attnd_req **out;   /* (cap) taken out of the queues this sweep */
    int *gone;         /* (cap) 1: out[i]'s client left; 0: its deadline passed */
    attnd_req **asked; /* (cap) the queued requests asked about */
    char *left;        /* (cap) 1: asked[i]'s client left */
} sweep_bufs;

static int sweep_bufs_init(sweep_bufs *b) {
    b->cap = 64;
    b->out = malloc(b->cap * sizeof(*b->out));
    b->gone = malloc(b->cap * sizeof(*b->gone));
    b->asked = malloc(b->cap * sizeof(*b->asked));
    b->left = malloc(b->cap * sizeof(*b->left));
    return b->out && b->gone && b->asked && b->left ? 0 : -1;
}

static void sweep_bufs_free(sweep_bufs *b) {
    free(b->out);
    free(b->gone);
    free(b->asked);
    free(b->left);
}

/* Room for every queued request (mutex held); on a failed allocation the
 * buffers keep their size and a sweep looks at fewer requests. */
static void grow_sweep_bufs(attnd_sched *s, sweep_bufs *b) {
    size_t queued = 0;
    for (int i = 0; i < s->nq; i++)
        queued += (size_t)s->q[i].count;
    if (queued <= b->cap) return;
    size_t c = b->cap;
    while (c < queued)
        c *= 2;
    attnd_req **o2 = realloc(b->out, c * sizeof(*o2));
    if (o2) b->out = o2;
    int *g2 = realloc(b->gone, c * sizeof(*g2));
    if (g2) b->gone = g2;
    attnd_req **a2 = realloc(b->asked, c * sizeof(*a2));
    if (a2) b->asked = a2;
    char *l2 = realloc(b->left, c * sizeof(*l2));
    if (l2) b->left = l2;
    if (o2 && g2 && a2 && l2) b->cap = c;
}

/* Takes the requests whose deadline passed out of the queues (mutex held),
 * into b->out from *n on; *wake becomes the next deadline. Every queued
 * request is looked at: a request's own timeout (timeout_ms, the
 * Request-Timeout-Ms header) may end it before older ones. */
static void collect_expired(attnd_sched *s, sweep_bufs *b, uint64_t now, size_t *n,
                            uint64_t *wake) {
    for (int i = 0; i < s->nq; i++) {
        attnd_req *r = s->q[i].head;
        while (r) {
            attnd_req *next = r->next;
            if (r->deadline_us <= now && *n < b->cap) {
                q_remove(&s->q[i], r);
                b->out[*n] = r;
                b->gone[(*n)++] = 0;
            } else if (r->deadline_us < *wake) {
                *wake = r->deadline_us;
            }
            r = next;
        }
    }
}

/* Takes the requests whose client left out of the queues (mutex held),
 * into b->out from *n on. Returns how many requests were asked about. */
static size_t collect_hangups(attnd_sched *s, sweep_bufs *b, size_t *n) {
    size_t na = 0;
    if (!s->o.departed) return 0;
    for (int i = 0; i < s->nq; i++)
        for (attnd_req *r = s->q[i].head; r && na < b->cap; r = r->next)
            b->asked[na++] = r;
    find_departed(s, b->asked, (int)na, b->left);
    for (size_t k = 0; k < na && *n < b->cap; k++) {
        if (!b->left[k]) continue;
        attnd_req *r = b->asked[k];
        q_remove(&s->q[r->job.model], r);
        b->out[*n] = r;
        b->gone[(*n)++] = 1;
    }
    return na;
}

/* Answers what a sweep took (mutex not held): a timeout past the deadline; a
 * client that left is dropped, not answered. */
static void answer_swept(attnd_sched *s, sweep_bufs *b, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (b->gone[k]) {
            deliver(s, b->out[k], NULL);
        } else {
            answer_timeout(s, b->out[k]);
        }
    }
}

/* The sweeper: answers queued requests past their deadline and drops those
 * whose client left, then sleeps until the next deadline (or the next
 * question about clients while requests are queued). */
static void *sweeper_main(void *arg) {
    attnd_sched *s = arg;
    sweep_bufs b;
    if (sweep_bufs_init(&b) < 0) goto cleanup;
    pthread_mutex_lock(&s->mu);
    while (!s->sweep_stop) {
        uint64_t now = attnd_mono_us(), wake = UINT64_MAX;
        size_t n = 0;
        grow_sweep_bufs(s, &b);
        collect_expired(s, &b, now, &n, &wake);
        if (collect_hangups(s, &b, &n) && now + HANGUP_POLL_US < wake) wake = now + HANGUP_POLL_US;
        if (n) {
            pthread_mutex_unlock(&s->mu);
            answer_swept(s, &b, n);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        s->sweep_wake = wake;
        timed_wait(&s->sweep_cv, &s->mu, wake);
        s->sweep_wake = 0; /* awake: it looks at every queued request before it sleeps */
    }
    pthread_mutex_unlock(&s->mu);
cleanup:
    sweep_bufs_free(&b);
    return NULL;
}

/* ---- public ---- */

/* Queues up to slot exist (mutex held): a model loaded while serving gets
 * its queue with its first request. 0, or -1 when out of memory. */
static int grow_queues(attnd_sched *s, int slot) {
    if (slot < s->nq) return 0;
    squeue *q = realloc(s->q, (size_t)(slot + 1) * sizeof *q);
    if (!q) return -1;
    memset(q + s->nq, 0, (size_t)(slot + 1 - s->nq) * sizeof *q);
    /* the queues moved: their requests' links point at requests, not
     * queues, so only the heads and tails moved with them */
    s->q = q;
    s->nq = slot + 1;
    return 0;
}

int attnd_sched_submit(attnd_sched *s, attnd_req *r, attnd_error *e) {
    const attnd_config *c = s->o.cfg;
    pthread_mutex_lock(&s->mu);
    if (grow_queues(s, r->job.model) < 0) {
        pthread_mutex_unlock(&s->mu);
        attnd_req_end_step(r, 0);
        return attnd_set_error(e, AERR_INTERNAL, "out of memory queueing the request");
    }
    squeue *q = &s->q[r->job.model];
    if (s->stop || q->count >= c->max_queue_requests) {
        pthread_mutex_unlock(&s->mu);
        attnd_req_end_step(r, 0); /* at once: the session's next step finds it free */
        if (s->stop) return attnd_set_error(e, AERR_UNAVAILABLE, "the server is shutting down");
        return attnd_set_error(e, AERR_QUEUE_FULL,
                               "the queue of model '%s' is full (%d requests); retry later",
                               r->job.ver->name, c->max_queue_requests);
    }
    attnd_req_ref(r);
    r->state = RQ_QUEUED;
    r->t_admit_us = attnd_mono_us();
    attnd_req_deadline(r, c->request_timeout_ms);
    q_push(q, r);
    pthread_cond_signal(&s->work_cv);
    if (r->deadline_us < s->sweep_wake) pthread_cond_signal(&s->sweep_cv); /* the next one */
    pthread_mutex_unlock(&s->mu);
    attn_ctx_wake(s->ctx); /* a resting pool wakes while the batcher does */
    return 0;
}

void attnd_sched_cancel(attnd_sched *s, attnd_req *r) {
    pthread_mutex_lock(&s->mu);
    r->cancelled = 1;
    int queued = r->state == RQ_QUEUED;
    if (queued) {
        q_remove(&s->q[r->job.model], r);
        r->state = RQ_DONE;
    }
    pthread_mutex_unlock(&s->mu);
    if (queued) attnd_req_unref(r);
}

void attnd_sched_drain(attnd_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Refuses every queued request (AERR_UNAVAILABLE) with msg. */
static void answer_queued(attnd_sched *s, const char *msg) {
    attnd_error e;
    attnd_set_error(&e, AERR_UNAVAILABLE, "%s", msg);
    for (int i = 0; i < s->nq; i++) {
        for (;;) {
            pthread_mutex_lock(&s->mu);
            attnd_req *r = s->q[i].head;
            if (r) q_remove(&s->q[i], r);
            pthread_mutex_unlock(&s->mu);
            if (!r) break;
            deliver(s, r, &e);
        }
    }
}

void attnd_sched_abort_queued(attnd_sched *s) {
    answer_queued(s, "the drain deadline passed before compute");
}

int attnd_sched_pending(attnd_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->running;
    for (int i = 0; i < s->nq; i++)
        n += s->q[i].count;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int attnd_sched_depth(attnd_sched *s, int slot) {
    pthread_mutex_lock(&s->mu);
    int n = slot >= 0 && slot < s->nq ? s->q[slot].count : 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void attnd_sched_metrics(attnd_sched *s, attnd_sbuf *b) {
    pthread_mutex_lock(&s->mu);
    int running = s->running;
    pthread_mutex_unlock(&s->mu);
    attnd_prom_single(b, "attnd_compute_threads", PROM_GAUGE, "Threads of the one compute pool.",
                      attn_ctx_threads(s->ctx));
    attnd_prom_single(b, "attnd_requests_running", PROM_GAUGE,
                      "Requests taken from the queues and not yet answered.", running);
}

void attnd_sched_stop(attnd_sched *s) {
    if (!s || s->stopped) return;
    s->stopped = 1;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->batcher_started) pthread_join(s->batcher, NULL);
    /* a batcher that never started leaves its queues to us */
    answer_queued(s, "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    s->sweep_stop = 1;
    pthread_cond_broadcast(&s->sweep_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->sweeper_started) pthread_join(s->sweeper, NULL);
}

void attnd_sched_free(attnd_sched *s) {
    if (!s) return;
    attnd_sched_stop(s);
    attnd_pipeline_free(s->pipe);
    attn_ctx_free(s->ctx);
    free(s->w.batch);
    free(s->w.expired);
    free(s->w.left);
    free(s->q);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->sweep_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

attnd_sched *attnd_sched_new(const attnd_sched_opts *o, char *err, size_t errlen) {
    attnd_sched *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory starting the scheduler");
        return NULL;
    }
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->work_cv, &ca);
    pthread_cond_init(&s->sweep_cv, &ca);
    pthread_condattr_destroy(&ca);
    s->q = calloc(1, sizeof(*s->q));
    s->nq = 1;
    int cap = o->cfg->max_batch_requests;
    s->w.batch = calloc((size_t)cap, sizeof(*s->w.batch));
    s->w.expired = calloc((size_t)cap, sizeof(*s->w.expired));
    s->w.left = calloc((size_t)cap, sizeof(*s->w.left));
    if (!s->q || !s->w.batch || !s->w.expired || !s->w.left) {
        snprintf(err, errlen, "out of memory starting the scheduler");
        goto fail;
    }
    s->ctx = attn_ctx_new(o->cfg->compute_threads);
    if (!s->ctx) {
        snprintf(err, errlen, "cannot create a compute pool of %d threads",
                 o->cfg->compute_threads);
        goto fail;
    }
    s->pipe = attnd_pipeline_new(s->ctx, cap);
    if (!s->pipe) {
        snprintf(err, errlen, "out of memory starting the scheduler");
        goto fail;
    }
    if (pthread_create(&s->batcher, NULL, batcher_main, s) != 0) {
        snprintf(err, errlen, "cannot start the batcher thread");
        goto fail;
    }
    s->batcher_started = 1;
    if (pthread_create(&s->sweeper, NULL, sweeper_main, s) != 0) {
        snprintf(err, errlen, "cannot start the sweeper thread");
        goto fail;
    }
    s->sweeper_started = 1;
    return s;
fail:
    attnd_sched_free(s);
    return NULL;
}
