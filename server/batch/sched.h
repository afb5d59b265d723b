/* sched.h - admission, batching and the one compute pool.
 *
 * Each model has a FIFO queue (by its slot, models/registry.h; a batch
 * holds requests of one version of it: weights never mix in a batch). One
 * batcher thread owns the process's compute pool (an attn_ctx of
 * cfg->compute_threads threads). As soon as compute is
 * free and a queue holds work it takes a batch of up to max_batch_requests
 * requests and max_batch_tokens tokens (waiting up to max_queue_delay_us
 * for company first, when that is set), packs the sequences without padding
 * into one attn_batch, computes it and writes the answers (pipeline.h: the
 * one road of every batch, KV-cache session steps included), each step
 * spread over the whole pool; requests that arrive meanwhile form the next
 * batch. Steps and ordinary requests of one model share a batch when every
 * request of it is self-attention.
 * A sweeper thread answers queued requests whose deadline passed and drops
 * those whose client left.

 */
#ifndef ATTND_SCHED_H
#define ATTND_SCHED_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../../config/config.h"
#include "../../core/attn.h"
#include "../base/reply.h"
#include "../body/request.h"
#include "../obs/metrics.h"
#include "req.h"

/* It knows no HTTP: a request comes in as a job (attnd_req, req.h), admitted
 * (admit.h), its answer goes out as a reply of some kind (base/reply.h)
 * through the finish callback, and whether a client left is the caller's
 * to say, through the departed callback. The HTTP side embeds attnd_req in
 * its own per-request struct. */
typedef void (*attnd_finish_fn)(attnd_req *r, void *arg);

typedef struct {
    const attnd_config *cfg; /* limits, batching and worker counts; borrowed */
    attnd_metrics *metrics;  /* borrowed */
    attnd_finish_fn finish;  /* r's reply is ready, or its client left; must not block */
    void *finish_arg;
    /* Which of n requests lost their client: sets left[i] = 1 for each, and
     * those are finished without a reply. Asked about queued requests by
     * the sweeper every 20 ms (with the scheduler's mutex held) and
     * about a batch's before it computes; must not block nor call the
     * scheduler. NULL: clients never leave. */
    void (*departed)(attnd_req *const *rs, int n, char *left, void *arg);
    void *departed_arg;
} attnd_sched_opts;

typedef struct attnd_sched attnd_sched;

/* Starts the compute pool (attn_ctx_new(cfg->compute_threads), resolved
 * from the CPUs before: server/base/cpus.c), the batcher and the sweeper. */
attnd_sched *attnd_sched_new(const attnd_sched_opts *o, char *err, size_t errlen);
/* Queues r (admitted: attnd_admit). Takes a reference on success.
 * Returns 0, or -1 with e set (AERR_QUEUE_FULL, AERR_UNAVAILABLE when
 * stopping) and r's session step, if any, dropped. */
int attnd_sched_submit(attnd_sched *s, attnd_req *r, attnd_error *e);
/* The connection of r closed: drop its queued work. */
void attnd_sched_cancel(attnd_sched *s, attnd_req *r);
/* Draining: batches go out without waiting for company. */
void attnd_sched_drain(attnd_sched *s);
/* The drain deadline passed: every request still queued is refused
 * (AERR_UNAVAILABLE) at once; running batches finish. */
void attnd_sched_abort_queued(attnd_sched *s);
/* Requests queued or running right now. */
int attnd_sched_pending(attnd_sched *s);
/* Requests in the queue of a model's slot (job.model) now. */
int attnd_sched_depth(attnd_sched *s, int slot);
/* The scheduler's gauges for GET /metrics: attnd_compute_threads (the
 * pool's size) and attnd_requests_running (taken from the queues, not yet
 * answered). */
void attnd_sched_metrics(attnd_sched *s, attnd_sbuf *b);
/* Lets the workers empty the queues and joins every thread; requests still
 * queued then are refused (AERR_UNAVAILABLE). Later calls do nothing. NULL
 * is fine. */
void attnd_sched_stop(attnd_sched *s);
/* Stops (when not yet stopped) and frees. NULL is fine. */
void attnd_sched_free(attnd_sched *s);

#endif
