/* pipeline.h - the one compute road: a batch of admitted requests of one
 * model, whole sequences and KV-cache session steps alike, packed without
 * padding into one attn_batch, computed by one attn_forward and answered,
 * each step spread over the compute pool. Steps ride in the batch as
 * sequences that carry their session's cache (attn_seq.kv and .cached);
 * a step's session keeps its new rows when its answer is written whole and
 * drops them otherwise.
 *
 * The scheduler's batcher runs every batch through here; so can a test or
 * a fuzz target, without HTTP and without the scheduler's threads
 * (attnd_pipeline_run on requests it made and admitted itself). No locks:
 * one pipeline belongs to one thread at a time.
 */
#ifndef ATTND_PIPELINE_H
#define ATTND_PIPELINE_H

#include "../../core/attn.h"
#include "../body/request.h"
#include "../obs/metrics.h"
#include "req.h"

typedef struct attnd_pipeline attnd_pipeline;

/* r is answered: its reply is set (AOK, AOK_CREATED or a refusal) and its
 * session step ended. Called once per request, from any of the pool's
 * threads. */
typedef void (*attnd_answered_fn)(void *arg, attnd_req *r);

/* A pipeline on the compute pool ctx (borrowed) for batches of at most
 * max_requests requests. NULL when out of memory. */
attnd_pipeline *attnd_pipeline_new(attn_ctx *ctx, int max_requests);
void attnd_pipeline_free(attnd_pipeline *p); /* NULL is fine */

/* Packs, computes and answers rs[0..n) (1 <= n <= max_requests), requests
 * of model m (info: its name and hyper-parameters) admitted by
 * attnd_admit; a batch with a session step holds self-attention requests
 * only (the scheduler picks them so). Each request gets its answer, or a
 * refusal: compute failed (500), a result that overflows float32 (400),
 * its deadline passed meanwhile (504). Observes compute, batch and queue
 * times and tokens into mt (NULL: none). Calls done(arg, r) for each. */
void attnd_pipeline_run(attnd_pipeline *p, const attn_model *m, const attnd_model_info *info,
                        attnd_metrics *mt, attnd_req **rs, int n, attnd_answered_fn done,
                        void *arg);

#endif
