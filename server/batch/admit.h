/* admit.h - what a parsed job needs before it is queued, whoever parsed it
 * (an HTTP handler, a test, a fuzz target): its tokens counted and, for a
 * KV-cache session job, its session step begun. This is the session
 * dispatch of every API: a job's session fields (job->session_id for a
 * step, job->session_open for an open: v2 parameters or the native session
 * routes) pick the table's open or begin, and an open's proposed id is the
 * X-Session-Id header's value, passed in as a plain string. No HTTP.
 */
#ifndef ATTND_ADMIT_H
#define ATTND_ADMIT_H

#include "../base/reply.h"
#include "../body/request.h"
#include "../session/session.h"
#include "req.h"

/* What admission reads. */
typedef struct {
    attnd_sessions *table;      /* the session table; borrowed */
    const attnd_parse_env *env; /* the served models and the limits; borrowed */
} attnd_admit_env;

/* Admits r, whose job is parsed (r->job). A job of no session: r->tokens
 * = B*(L+S), nothing else. A session job: refused when it gives both a
 * session_id and session_open, when its session is unknown, or when it is
 * not a step's shape (attnd_job_check_step) or not of the session's model;
 * else its step is begun in r->step (an open takes x_session_id, when not
 * NULL, as its id; a step ignores it), the job made causal over the cache
 * (S = cached + L), its attention_top_k checked against S and its
 * attention answer against the limit, and
 * r->tokens = L (the batch limit counts new rows). now: monotonic seconds.
 * Returns 0 when r is ready to queue; 1 when it is answered already (an
 * open without a prefix: r->reply is its 201); -1 with e set (and
 * *retry_after_s > 0 with a 429 of a full table). A step begun is ended
 * by attnd_req_clear if r is never computed. */
int attnd_admit(const attnd_admit_env *a, attnd_req *r, const char *x_session_id, double now,
                attnd_error *e, int *retry_after_s);

#endif
