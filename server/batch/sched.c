/* sched.c - model queues, the batcher, and the deadline/hang-up sweeper.
 * See sched.h.
 *
 * One batcher thread owns the process's one compute pool (an attn_ctx of
 * cfg->worker_threads threads: the batcher's own and its helpers). As soon
 * as compute is free and a queue holds work it takes a batch, up to the
 * token and request caps (continuous batching: requests that arrive while
 * a batch computes form the next one), and runs it in steps named for what
 * they do: drop the departed, pack, compute, answer. Packing, the forward
 * and the answers (JSON, base64 or binary: answer.c, which cuts a large
 * answer into chunks for every thread) all spread over the whole pool;
 * nothing goes through one thread.
 *
 * Locking: one mutex guards every queue and every attnd_req's scheduling
 * fields. The batcher and the sweeper take requests out under it and
 * answer them outside it. finish() is never called with the mutex held;
 * departed() is asked with it held by the sweeper, without it by the
 * batcher.
 *
 * No HTTP in here: a request is a job, an answer a reply of some kind
 * (errors.h), whose status is the HTTP side's to derive; whether a client
 * left is the HTTP side's to say (attnd_sched_opts.departed).
 *
 * Mixed batches: a batch may hold self-attention and cross-attention
 * requests of the same model. When every request is self-attention the
 * batch goes to the core with key == NULL (one QKV projection); otherwise
 * the self-attention queries are copied in as their own keys and values
 * (the core's numbers are the same either way: docs/performance.md).
 */
#include "sched.h"
#include "../body/answer.h"
#include "../codec/tensor.h"
#include "steps.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/buffer.h"
#include "../base/clock.h"
#include "../obs/prom.h"

/* How often the sweeper asks whether queued requests' clients left. */
#define HANGUP_POLL_US 20000

typedef struct {
    attnd_req *head, *tail; /* FIFO, oldest first */
    int count;              /* requests queued */
    long long tokens;       /* their tokens */
} squeue;

/* The batcher's grow-only scratch, reused across batches. */
typedef struct {
    float *q, *k, *v, *out; /* packed query (T,E), key (U,Kd), value (U,Vd), output (T,E) */
    size_t qcap, kcap, vcap, outcap; /* floats */
    attn_seq *seqs;                  /* (B) */
    size_t seqcap;
    size_t *off;           /* (3n) per request: first query, key and output float */
    size_t offcap;         /* requests */
    attnd_req **batch;     /* (max_batch_requests) the batch being run */
    attnd_req **expired;   /* (max_batch_requests) met past their deadline */
    char *keep;            /* (max_batch_requests) 1: batch[i]'s answer is left to write */
    char *left;            /* (max_batch_requests) 1: batch[i]'s client left */
    attnd_answer *answers; /* (max_batch_requests) the answers being written */
    int *who;              /* (max_batch_requests) answers[a] is batch[who[a]]'s */
} scratch;

struct attnd_sched {
    attnd_sched_opts o;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* the batcher waits for work */
    pthread_cond_t sweep_cv; /* the sweeper waits for deadlines */
    squeue *q;               /* (n_models) */
    int rr;                  /* queue the next pick starts at (fairness) */
    int running;             /* requests taken by the batcher, not yet answered */
    int draining;            /* 1: no waiting for company */
    int stop;                /* 1: the batcher exits once the queues are empty */
    int sweep_stop;          /* 1: the sweeper exits */
    attn_ctx *ctx;           /* the one compute pool; used by the batcher only */
    scratch w;               /* the batcher's */
    pthread_t batcher;
    int batcher_started;
    pthread_t sweeper;
    int sweeper_started;
    int stopped; /* 1 after attnd_sched_stop (main thread only) */
};

void attnd_req_ref(attnd_req *r) {
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
}

void attnd_req_unref(attnd_req *r) {
    if (!r) return;
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) r->free_fn(r);
}

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
 * reference. */
static void deliver(attnd_sched *s, attnd_req *r, const attnd_error *e) {
    if (e) attnd_reply_error(&r->reply, e);
    pthread_mutex_lock(&s->mu);
    int cancelled = r->cancelled;
    r->state = RQ_DONE;
    pthread_mutex_unlock(&s->mu);
    if (!cancelled) s->o.finish(r, s->o.finish_arg);
    attnd_req_unref(r);
}

/* r's deadline passed before it was answered. */
static void answer_timeout(attnd_sched *s, attnd_req *r) {
    attnd_error e;
    attnd_set_error(&e, AERR_TIMEOUT, "request not done within %d ms; its work was dropped",
                    s->o.cfg->request_timeout_ms);
    deliver(s, r, &e);
}

/* Asks the HTTP side which of rs[0..n) lost their client (left[i] = 1). */
static void find_departed(attnd_sched *s, attnd_req *const *rs, int n, char *left) {
    memset(left, 0, (size_t)n);
    if (s->o.departed && n > 0) s->o.departed(rs, n, left, s->o.departed_arg);
}

/* ---- the batcher ---- */

/* Room for n floats in the scratch array *p of *cap floats, doubling. */
static int grow_floats(float **p, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < n)
        c *= 2;
    float *q = realloc(*p, c * sizeof(float));
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* A batch on its way through run_batch's steps. */
typedef struct {
    attnd_sched *s;
    attnd_req **rs; /* (n) the requests still wanted */
    int n;
    const attn_model *m;
    const attnd_model_info *info;
    attn_batch b;
    size_t T, U;      /* query and key tokens */
    int all_self;     /* 1: key == NULL for the core */
    int need_value;   /* 1: a packed value separate from the key */
    long long tokens; /* query + key tokens, for the metrics */
    int fail;         /* 1: no answer but err */
    char err[256];
    uint64_t t0, t1; /* compute */
} batch_run;

/* ---- step 1: drop the departed ---- */

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

/* ---- step 2: pack ---- */

/* Sizes, kinds and each request's offsets into the packed buffers. */
static void measure(batch_run *br, size_t *off) {
    const attn_hparams *hp = &br->m->hp;
    size_t E = (size_t)hp->embed_dim, Kd = (size_t)hp->kdim, Vd = (size_t)hp->vdim;
    int any_value = 0, any_self = 0;
    br->all_self = 1;
    br->T = br->U = 0;
    br->tokens = 0;
    for (int i = 0; i < br->n; i++) {
        attnd_job *j = &br->rs[i]->job;
        off[3 * i] = br->T * E;      /* query and output */
        off[3 * i + 1] = br->U * Kd; /* key */
        off[3 * i + 2] = br->U * Vd; /* value */
        br->T += (size_t)j->B * j->L;
        br->U += (size_t)j->B * j->S;
        br->tokens += br->rs[i]->tokens;
        br->all_self &= j->self;
        any_self |= j->self;
        any_value |= j->value != NULL;
    }
    br->need_value = any_value || any_self;
}

/* Each request's attention-matrix buffer, when it asked for one. */
static int alloc_attention(batch_run *br) {
    for (int i = 0; i < br->n; i++) {
        attnd_job *j = &br->rs[i]->job;
        if (j->weights == ATTN_WEIGHTS_NONE) continue;
        uint64_t na = attnd_job_attention_floats(j, br->m->hp.num_heads); /* admitted: it fits */
        free(j->attn);
        j->attn = malloc(na * sizeof(float));
        if (!j->attn) return -1;
    }
    return 0;
}

/* The packed buffers of this batch, grown as needed. */
static int reserve(scratch *w, const batch_run *br) {
    const attn_hparams *hp = &br->m->hp;
    size_t B = 0;
    for (int i = 0; i < br->n; i++)
        B += (size_t)br->rs[i]->job.B;
    if (B > w->seqcap) {
        attn_seq *sq = realloc(w->seqs, B * sizeof(attn_seq));
        if (!sq) return -1;
        w->seqs = sq;
        w->seqcap = B;
    }
    if (grow_floats(&w->out, &w->outcap, br->T * (size_t)hp->embed_dim) < 0) return -1;
    if (br->n == 1) return 0; /* the request's own buffers go in as they are */
    if (grow_floats(&w->q, &w->qcap, br->T * (size_t)hp->embed_dim) < 0) return -1;
    if (br->all_self) return 0;
    if (grow_floats(&w->k, &w->kcap, br->U * (size_t)hp->kdim) < 0) return -1;
    if (br->need_value && grow_floats(&w->v, &w->vcap, br->U * (size_t)hp->vdim) < 0) return -1;
    return 0;
}

/* One request's inputs into the packed buffers (a pool task). */
static void pack_task(void *arg, int i, int thread) {
    (void)thread;
    batch_run *br = arg;
    scratch *w = &br->s->w;
    const attn_hparams *hp = &br->m->hp;
    const attnd_job *j = &br->rs[i]->job;
    const size_t *off = w->off + 3 * (size_t)i;
    size_t rows_q = (size_t)j->B * j->L, rows_k = (size_t)j->B * j->S;
    memcpy(w->q + off[0], j->query, rows_q * hp->embed_dim * sizeof(float));
    if (br->all_self) return;
    const float *k = j->self ? j->query : j->key;
    const float *v = j->self ? j->query : j->value ? j->value : j->key;
    memcpy(w->k + off[1], k, rows_k * hp->kdim * sizeof(float));
    if (br->need_value) memcpy(w->v + off[2], v, rows_k * hp->vdim * sizeof(float));
}

/* The core's view of each sequence: lengths, masks, where its weights go. */
static void describe_sequences(batch_run *br, attn_seq *seqs) {
    size_t si = 0;
    int H = br->m->hp.num_heads;
    for (int i = 0; i < br->n; i++) {
        attnd_job *j = &br->rs[i]->job;
        size_t ls = (size_t)j->L * j->S;
        uint64_t per_attn = attnd_attention_floats(1, j->L, j->S, j->weights, H);
        for (int bb = 0; bb < j->B; bb++, si++) {
            attn_seq *q = &seqs[si];
            memset(q, 0, sizeof(*q));
            q->L = j->L;
            q->S = j->S;
            q->causal = j->causal;
            if (j->kpm) q->key_padding_mask = j->kpm + (size_t)bb * j->S;
            size_t mo = j->mask_per_seq ? (size_t)bb * ls : 0;
            if (j->mask_bool) q->attn_mask_bool = j->mask_bool + mo;
            if (j->mask_add) q->attn_mask_add = j->mask_add + mo;
            if (j->positions) q->positions = j->positions + (size_t)bb * j->L;
            q->weights = j->weights;
            if (j->attn) q->attn = j->attn + (size_t)bb * per_attn;
        }
    }
    br->b.B = (int)si;
    br->b.seqs = seqs;
}

/* Packs the requests into one attn_batch; on failure br->fail and err. */
static void pack(batch_run *br) {
    scratch *w = &br->s->w;
    if ((size_t)br->n > w->offcap) {
        size_t *o = realloc(w->off, 3 * (size_t)br->n * sizeof(size_t));
        if (!o) goto oom;
        w->off = o;
        w->offcap = (size_t)br->n;
    }
    measure(br, w->off);
    if (alloc_attention(br) < 0) {
        snprintf(br->err, sizeof(br->err), "out of memory for attention matrices");
        br->fail = 1;
        return;
    }
    if (reserve(w, br) < 0) goto oom;
    memset(&br->b, 0, sizeof(br->b));
    if (br->n == 1) {
        const attnd_job *j = &br->rs[0]->job;
        br->b.query = j->query;
        br->b.key = j->self ? NULL : j->key;
        br->b.value = j->self ? NULL : j->value;
    } else {
        attn_ctx_parallel(br->s->ctx, br->n, pack_task, br);
        br->b.query = w->q;
        br->b.key = br->all_self ? NULL : w->k;
        br->b.value = br->all_self || !br->need_value ? NULL : w->v;
    }
    describe_sequences(br, w->seqs);
    br->b.out = w->out;
    return;
oom:
    snprintf(br->err, sizeof(br->err), "out of memory packing a batch");
    br->fail = 1;
}

/* ---- step 3: compute ---- */

static void compute(batch_run *br) {
    br->t0 = attnd_mono_us();
    if (!br->fail && attn_forward(br->s->ctx, br->m, &br->b, br->err, sizeof(br->err)) < 0)
        br->fail = 1;
    br->t1 = attnd_mono_us();
    if (br->fail) return;
    attnd_metrics *mt = br->s->o.metrics;
    attnd_hist_observe(&mt->compute_seconds, br->t1 - br->t0);
    attnd_hist_observe(&mt->batch_size, (uint64_t)br->n);
    attnd_hist_observe(&mt->batch_tokens, (uint64_t)br->tokens);
    atomic_fetch_add_explicit(&mt->tokens, (uint64_t)br->tokens, memory_order_relaxed);
}

/* ---- step 4: answer ---- */

/* Request i's rows of the batch's output. */
static const float *output_of(const batch_run *br, int i) {
    return br->s->w.out + br->s->w.off[3 * (size_t)i];
}

/* 1 when request i's output and attention matrices are finite. */
static int result_finite(const batch_run *br, int i) {
    const attnd_job *j = &br->rs[i]->job;
    size_t nout = (size_t)j->B * j->L * br->m->hp.embed_dim;
    uint64_t na = j->attn ? attnd_job_attention_floats(j, br->m->hp.num_heads) : 0;
    return attnd_first_nonfinite(output_of(br, i), nout, 0) == nout &&
           attnd_first_nonfinite(j->attn, na, 0) == na;
}

/* Answers request i at once when it gets no output: the compute failed,
 * the result overflows, or its deadline passed. Returns 1 when it did. */
static int answered_early(batch_run *br, int i) {
    attnd_sched *s = br->s;
    attnd_req *r = br->rs[i];
    attnd_error e;
    if (br->fail) {
        attnd_set_error(&e, AERR_INTERNAL, "compute failed: %.200s", br->err);
        deliver(s, r, &e);
    } else if (!result_finite(br, i)) {
        /* the input's magnitudes did it: a client error, not the server's */
        attnd_set_error(&e, AERR_BAD_REQUEST, "%s", ATTND_MSG_OVERFLOW);
        deliver(s, r, &e);
    } else if (attnd_mono_us() > r->deadline_us) {
        answer_timeout(s, r);
    } else {
        return 0;
    }
    return 1;
}

/* Request i's times, then its checks (a pool task); w.keep[i] = 1 when its
 * answer is left to write. */
static void check_task(void *arg, int i, int thread) {
    (void)thread;
    batch_run *br = arg;
    attnd_req *r = br->rs[i];
    r->t_start_us = br->t0;
    r->t_end_us = br->t1;
    r->batch_requests = br->n;
    attnd_hist_observe(&br->s->o.metrics->queue_seconds, br->t0 - r->t_admit_us);
    br->s->w.keep[i] = !answered_early(br, i);
}

/* Answer a, written (answer.c), goes into its request and to the HTTP side. */
static void answer_written(void *arg, int a) {
    batch_run *br = arg;
    const attnd_answer *an = &br->s->w.answers[a];
    attnd_req *r = br->rs[br->s->w.who[a]];
    attnd_job *j = &r->job;
    if (!an->body) {
        attnd_error e;
        attnd_set_error(&e, AERR_INTERNAL, "out of memory writing the answer");
        deliver(br->s, r, &e);
        return;
    }
    attnd_reply_set(&r->reply, AOK, an->body, an->body_len, an->json_len);
    /* the inputs are no longer needed: free them now, not at completion */
    free(j->query);
    free(j->key);
    free(j->value);
    j->query = j->key = j->value = NULL;
    deliver(br->s, r, NULL);
}

/* Checks every request of the batch, then writes the answers left over the
 * whole pool: a large one in chunks on every thread (answer.h). */
static void answer(batch_run *br) {
    scratch *w = &br->s->w;
    attn_ctx_parallel(br->s->ctx, br->n, check_task, br);
    int na = 0;
    for (int i = 0; i < br->n; i++) {
        if (!w->keep[i]) continue;
        attnd_req *r = br->rs[i];
        w->who[na] = i;
        w->answers[na++] = (attnd_answer){.job = &r->job,
                                          .model = br->info,
                                          .out = output_of(br, i),
                                          .usage = {.batch_requests = br->n,
                                                    .queue_us = br->t0 - r->t_admit_us,
                                                    .compute_us = br->t1 - br->t0}};
    }
    attnd_write_answers(br->s->ctx, w->answers, na, answer_written, br);
}

/* A batch of KV-cache session steps: steps.c computes and answers them. */
static void run_steps(attnd_sched *s, attnd_req **rs, int n) {
    int mi = rs[0]->job.model;
    uint64_t t0, t1;
    attnd_steps_run(s->ctx, &s->o.models[mi], &s->o.info[mi], rs, n, &t0, &t1);
    attnd_metrics *mt = s->o.metrics;
    attnd_hist_observe(&mt->compute_seconds, t1 - t0);
    attnd_hist_observe(&mt->batch_size, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        attnd_hist_observe(&mt->queue_seconds, t0 - rs[i]->t_admit_us);
        atomic_fetch_add_explicit(&mt->tokens, (uint64_t)rs[i]->tokens, memory_order_relaxed);
        deliver(s, rs[i], NULL);
    }
}

/* The batch's requests are answered: they no longer count as running. */
static void release(attnd_sched *s, int taken) {
    pthread_mutex_lock(&s->mu);
    s->running -= taken;
    pthread_mutex_unlock(&s->mu);
}

/* Drops the departed, packs, computes and answers one batch of n requests
 * of one model. */
static void run_batch(attnd_sched *s, attnd_req **rs, int taken) {
    int n = drop_departed(s, rs, taken);
    if (n > 0 && rs[0]->step) {
        run_steps(s, rs, n);
    } else if (n > 0) {
        int mi = rs[0]->job.model;
        batch_run br = {.s = s, .rs = rs, .n = n, .m = &s->o.models[mi], .info = &s->o.info[mi]};
        pack(&br);
        compute(&br);
        answer(&br);
    }
    release(s, taken);
}

/* Takes a batch from the first ready queue (mutex held). Expired requests
 * met on the way go to *expired. Returns the batch size, 0 when nothing is
 * ready; *wake is when the earliest waiting queue becomes ready. */
static int pick(attnd_sched *s, attnd_req **batch, int cap, attnd_req **expired, int *nexp,
                uint64_t *wake) {
    const attnd_config *c = s->o.cfg;
    uint64_t now = attnd_mono_us();
    *wake = UINT64_MAX;
    for (int t = 0; t < s->o.n_models; t++) {
        int qi = (s->rr + t) % s->o.n_models;
        squeue *q = &s->q[qi];
        if (!q->count) continue;
        uint64_t ready_at = q->head->t_admit_us + (uint64_t)c->max_queue_delay_us;
        int ready = s->draining || s->stop || q->count >= c->max_batch_requests ||
                    q->tokens >= c->max_batch_tokens || now >= ready_at;
        if (!ready) {
            if (ready_at < *wake) *wake = ready_at;
            continue;
        }
        int n = 0;
        long long tokens = 0;
        while (q->head && n < cap && *nexp < cap) {
            attnd_req *r = q->head;
            if (n > 0 && tokens + r->tokens > c->max_batch_tokens) break;
            if (n > 0 && !r->step != !batch[0]->step) break; /* steps batch with steps */
            q_remove(q, r);
            if (now >= r->deadline_us) {
                expired[(*nexp)++] = r;
                continue;
            }
            r->state = RQ_RUNNING;
            batch[n++] = r;
            tokens += r->tokens;
        }
        s->running += n;
        s->rr = (qi + 1) % s->o.n_models;
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
static void *batcher_main(void *arg) {
    attnd_sched *s = arg;
    int cap = s->o.cfg->max_batch_requests;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        uint64_t wake;
        int nexp = 0;
        int n = pick(s, s->w.batch, cap, s->w.expired, &nexp, &wake);
        if (n == 0 && nexp == 0) {
            int queued = 0;
            for (int i = 0; i < s->o.n_models; i++)
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
    for (int i = 0; i < s->o.n_models; i++)
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
 * into b->out from *n on; *wake becomes the next deadline. The queues are
 * in admission order, so only their heads are looked at. */
static void collect_expired(attnd_sched *s, sweep_bufs *b, uint64_t now, size_t *n,
                            uint64_t *wake) {
    for (int i = 0; i < s->o.n_models; i++) {
        squeue *q = &s->q[i];
        while (q->head && q->head->deadline_us <= now && *n < b->cap) {
            attnd_req *r = q->head;
            q_remove(q, r);
            b->out[*n] = r;
            b->gone[(*n)++] = 0;
        }
        if (q->head && q->head->deadline_us < *wake) *wake = q->head->deadline_us;
    }
}

/* Takes the requests whose client left out of the queues (mutex held),
 * into b->out from *n on. Returns how many requests were asked about. */
static size_t collect_hangups(attnd_sched *s, sweep_bufs *b, size_t *n) {
    size_t na = 0;
    if (!s->o.departed) return 0;
    for (int i = 0; i < s->o.n_models; i++)
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
        timed_wait(&s->sweep_cv, &s->mu, wake);
    }
    pthread_mutex_unlock(&s->mu);
cleanup:
    sweep_bufs_free(&b);
    return NULL;
}

/* ---- public ---- */

int attnd_sched_submit(attnd_sched *s, attnd_req *r, attnd_error *e) {
    const attnd_config *c = s->o.cfg;
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return attnd_set_error(e, AERR_UNAVAILABLE, "the server is shutting down");
    }
    squeue *q = &s->q[r->job.model];
    if (q->count >= c->max_queue_requests) {
        pthread_mutex_unlock(&s->mu);
        return attnd_set_error(e, AERR_QUEUE_FULL,
                               "the queue of model '%s' is full (%d requests); retry later",
                               s->o.info[r->job.model].name, c->max_queue_requests);
    }
    attnd_req_ref(r);
    r->state = RQ_QUEUED;
    r->t_admit_us = attnd_mono_us();
    r->deadline_us = r->t_admit_us + (uint64_t)c->request_timeout_ms * 1000u;
    int was_empty = q->count == 0;
    q_push(q, r);
    pthread_cond_signal(&s->work_cv);
    if (was_empty) pthread_cond_signal(&s->sweep_cv);
    pthread_mutex_unlock(&s->mu);
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
    for (int i = 0; i < s->o.n_models; i++) {
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
    for (int i = 0; i < s->o.n_models; i++)
        n += s->q[i].count;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void attnd_sched_depths(attnd_sched *s, int *depth) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->o.n_models; i++)
        depth[i] = s->q[i].count;
    pthread_mutex_unlock(&s->mu);
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
    attn_ctx_free(s->ctx);
    scratch *w = &s->w;
    free(w->q);
    free(w->k);
    free(w->v);
    free(w->out);
    free(w->seqs);
    free(w->off);
    free(w->batch);
    free(w->expired);
    free(w->keep);
    free(w->left);
    free(w->answers);
    free(w->who);
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
    s->q = calloc((size_t)o->n_models, sizeof(*s->q));
    int cap = o->cfg->max_batch_requests;
    s->w.batch = calloc((size_t)cap, sizeof(*s->w.batch));
    s->w.expired = calloc((size_t)cap, sizeof(*s->w.expired));
    s->w.keep = calloc((size_t)cap, sizeof(*s->w.keep));
    s->w.left = calloc((size_t)cap, sizeof(*s->w.left));
    s->w.answers = calloc((size_t)cap, sizeof(*s->w.answers));
    s->w.who = calloc((size_t)cap, sizeof(*s->w.who));
    if (!s->q || !s->w.batch || !s->w.expired || !s->w.keep || !s->w.left || !s->w.answers ||
        !s->w.who) {
        snprintf(err, errlen, "out of memory starting the scheduler");
        goto fail;
    }
    s->ctx = attn_ctx_new(o->cfg->worker_threads);
    if (!s->ctx) {
        snprintf(err, errlen, "cannot create a compute pool of %d threads", o->cfg->worker_threads);
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
