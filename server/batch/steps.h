/* steps.h - KV-cache sessions over HTTP, between the parser and the core:
 * a session route's body becomes a job plus a begun session step
 * (attnd_step_prepare, on the HTTP thread); the scheduler batches steps of
 * one model together and hands them to attnd_steps_run (on the batcher),
 * which computes them with attn_step_forward and writes each answer, both
 * over the compute pool. A step that
 * never computes (refused, timed out, its client gone, draining) is ended
 * without keeping its rows by attnd_step_release, from the request's free.
 * The session table itself is session.c; HTTP is http.c.
 */
#ifndef ATTND_STEPS_H
#define ATTND_STEPS_H

#include <stddef.h>

#include "../../config/config.h"
#include "../../core/attn.h"
#include "../base/buffer.h"
#include "../base/reply.h"
#include "../body/request.h"
#include "session.h"

typedef struct attnd_req attnd_req;

/* The refusal of a session id the table does not hold: the id, then
 * attnd_session_status_text(SESS_NOT_FOUND). */
#define ATTND_MSG_NO_SESSION "session '%.40s': %s"

/* A session step riding on a request (attnd_req.step). Owned by it. */
typedef struct attnd_step_req {
    attnd_sessions *table; /* borrowed */
    attnd_session_step st; /* begun; st.s == NULL once ended */
    char id[ATTND_SESSION_ID_LEN + 1];
    int opened; /* 1: the request opened the session (201) */
} attnd_step_req;

/* What a session request needs besides its body. */
typedef struct {
    attnd_sessions *table;
    const attnd_parse_env *env;
    const attnd_config *cfg; /* models[i].max_positions */
    const char *id;          /* the session of a step, NULL to open one */
    const char *want_id;     /* an open's proposed id (X-Session-Id), or NULL */
    double now;              /* monotonic seconds */
} attnd_step_env;

/* Reads the body of POST /v1/sessions (query optional: the prefix) or POST
 * /v1/sessions/{id}/attention (query required) and begins the step. On
 * success job holds the rows (B = 1, L = new rows, S = cached + new, self,
 * causal) and *out the step (NULL for an open without a prefix, which is
 * answered at once: see attnd_step_open_answer). Returns 0, or -1 with e
 * set; *retry_after_s > 0 with a 429. */
int attnd_step_prepare(const attnd_step_env *se, const char *body, size_t len, attnd_job *job,
                       attnd_step_req **out, char opened_id[ATTND_SESSION_ID_LEN + 1],
                       attnd_error *e, int *retry_after_s);

/* Begins the step of an already parsed job (a v2 infer whose parameters
 * name a session, or open one): se->id is the session, NULL to open. Frees
 * the job on failure. Same returns as attnd_step_prepare. */
int attnd_step_from_job(const attnd_step_env *se, attnd_job *job, attnd_step_req **out,
                        attnd_error *e, int *retry_after_s);

/* The 201 body of an open without a prefix, NULL when out of memory. */
char *attnd_step_open_answer(const char *id, const char *model, size_t *len);

/* Computes n requests that are steps of one model on the compute pool ctx
 * and writes each answer into its request's reply (the session's id and
 * cached tokens in place, answer.c) over the same pool, or its refusal.
 * Ends every step: kept when computed and written, dropped when not. */
void attnd_steps_run(attn_ctx *ctx, const attn_model *m, const attnd_model_info *info,
                     attnd_req **rs, int n, uint64_t *t0, uint64_t *t1);

/* Ends a step that was not computed (its rows are dropped) and frees it. */
void attnd_step_release(attnd_step_req *sr, double now);

/* The session gauges and counters for GET /metrics. It only reads: idle
 * sessions are ended by the table's reaper (session.h), not by a scrape. */
void attnd_steps_metrics(attnd_sessions *t, attnd_sbuf *b);

/* Monotonic seconds, the session table's clock. */
double attnd_step_now(void);

#endif
