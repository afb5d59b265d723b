/* sched.h - admission, batching and the one compute pool.
 *
 * Each model has a FIFO queue. One batcher thread owns the process's compute
 * pool (an attn_ctx of cfg->worker_threads threads). As soon as compute is
 * free and a queue holds work it takes a batch of up to max_batch_requests
 * requests and max_batch_tokens tokens (waiting up to max_queue_delay_us
 * for company first, when that is set), packs the sequences without padding
 * into one attn_batch, computes it and writes the answers, each step spread
 * over the whole pool; requests that arrive meanwhile form the next batch.
 * Answers go to the HTTP side through the finish callback (which resumes
 * the suspended connection). A sweeper thread answers 504 to queued
 * requests whose deadline passed and drops queued requests whose client
 * hung up. No HTTP library in here: the HTTP side sees only attnd_req.
 */
#ifndef ATTND_SCHED_H
#define ATTND_SCHED_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/config.h"
#include "../core/attn.h"
#include "errors.h"
#include "metrics.h"
#include "request.h"

typedef enum {
    RQ_NEW = 0, /* not admitted */
    RQ_QUEUED,  /* in its model's queue */
    RQ_RUNNING, /* taken by the batcher */
    RQ_DONE     /* answered (or dropped) */
} rq_state;

typedef struct attnd_req attnd_req;

/* One request on its way through the scheduler. The HTTP side embeds it as
 * the first member of its own per-request struct. */
struct attnd_req {
    atomic_int refs;               /* one for the connection, one for the scheduler while queued or
                                      running; the last unref calls free_fn */
    void (*free_fn)(attnd_req *r); /* frees the embedding struct */
    /* guarded by the scheduler mutex */
    rq_state state;
    attnd_req *prev, *next; /* queue links */
    int cancelled;          /* 1: the connection is gone; never finish() it */
    /* set before admission */
    attnd_job job;        /* what to compute; owned */
    long long tokens;     /* B*(L+S), for the batch token limit */
    int sock;             /* client socket, polled for hang-ups while queued; -1 = don't */
    uint64_t t_admit_us;  /* attnd_mono_us() at admission */
    uint64_t deadline_us; /* t_admit_us + request_timeout_ms */
    /* the answer, written once by whoever finishes the request, before finish() */
    int status;    /* HTTP status of the answer */
    attnd_err err; /* AERR_NONE for 200 */
    char *body;    /* malloc'd answer body; the HTTP side takes it */
    size_t body_len;
    size_t json_len;               /* > 0: the body is JSON of this length, then binary tensors */
    int gone;                      /* 1: the client hung up: close, do not answer */
    uint64_t t_start_us, t_end_us; /* compute of its batch; 0 when it never ran */
    int batch_requests;            /* requests in that batch */
    struct attnd_step_req *step;   /* a KV-cache session step (steps.h), owned; NULL otherwise */
};

void attnd_req_ref(attnd_req *r);
void attnd_req_unref(attnd_req *r);

typedef void (*attnd_finish_fn)(attnd_req *r, void *arg);

typedef struct {
    const attnd_config *cfg;      /* limits, batching and worker counts; borrowed */
    const attn_model *models;     /* (n_models) weights; borrowed */
    const attnd_model_info *info; /* (n_models) names and hyper-parameters; borrowed */
    int n_models;
    attnd_metrics *metrics; /* borrowed */
    attnd_finish_fn finish; /* the answer of r is ready; must not block */
    void *finish_arg;
} attnd_sched_opts;

typedef struct attnd_sched attnd_sched;

/* Starts the compute pool (attn_ctx_new(cfg->worker_threads), resolved
 * from the CPUs before: server/cpus.c), the batcher and the sweeper. */
attnd_sched *attnd_sched_new(const attnd_sched_opts *o, char *err, size_t errlen);
/* Queues r (its job, tokens and sock set). Takes a reference on success.
 * Returns 0, or -1 with e set (429 queue full, 503 stopping). */
int attnd_sched_submit(attnd_sched *s, attnd_req *r, attnd_error *e);
/* The connection of r closed: drop its queued work. */
void attnd_sched_cancel(attnd_sched *s, attnd_req *r);
/* Draining: batches go out without waiting for company. */
void attnd_sched_drain(attnd_sched *s);
/* The drain deadline passed: every request still queued is answered 503
 * at once; running batches finish. */
void attnd_sched_abort_queued(attnd_sched *s);
/* Requests queued or running right now. */
int attnd_sched_pending(attnd_sched *s);
/* Queue depth per model into depth[n_models]. */
void attnd_sched_depths(attnd_sched *s, int *depth);
/* The scheduler's gauges for GET /metrics: attnd_compute_threads (the
 * pool's size) and attnd_requests_running (taken from the queues, not yet
 * answered). */
void attnd_sched_metrics(attnd_sched *s, attnd_sbuf *b);
/* Lets the workers empty the queues and joins every thread; requests still
 * queued then are answered 503. Later calls do nothing. NULL is fine. */
void attnd_sched_stop(attnd_sched *s);
/* Stops (when not yet stopped) and frees. NULL is fine. */
void attnd_sched_free(attnd_sched *s);

/* The answer body for an error (also used by the HTTP side). */
void attnd_req_fail(attnd_req *r, const attnd_error *e);

#endif
