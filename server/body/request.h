/* request.h - the native body's reader (request.c): POST /v1/attention,
 * /v1/models/{name}/attention and a session's open and steps read into
 * one checked attnd_job (job.h; the v2 body is v2.h's). Also the entry of
 * the answer writers (answer.c), which write a job's answer back for every
 * API. No HTTP and no threads in here.
 */
#ifndef ATTND_REQUEST_H
#define ATTND_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "../base/buffer.h"
#include "../base/reply.h"
#include "job.h"

/* Reads a native body. path_model is the {name} of
 * /v1/models/{name}/attention or NULL. Returns 0, or -1 with e set
 * (400, 404, 413, 500); job holds nothing to free after a failure. */
int attnd_parse_native(const attnd_parse_env *env, const char *path_model, const char *body,
                       size_t len, attnd_job *job, attnd_error *e);

/* Reads the body of POST /v1/sessions: a native body whose query, the
 * session's prefix, may be left out (an empty body gives nothing).
 * job->session_open is set. Returns 1 when it holds a query: job is then
 * as attnd_parse_native makes it. Returns 0 when it does not: only "model"
 * may be given then, and job holds nothing but job->model and job->ver. Returns -1 with
 * e set (400, 404, 413, 500); job holds nothing to free after a failure. */
int attnd_parse_session_open(const attnd_parse_env *env, const char *body, size_t len,
                             attnd_job *job, attnd_error *e);

/* Reads the body of POST /v1/sessions/{id}/attention: a native body for
 * the version of the model the session was opened on (ver, borrowed: the
 * job takes its own reference), job->session_id set to id. Same returns
 * as attnd_parse_native. */
int attnd_parse_session_step(const attnd_parse_env *env, attnd_version *ver, const char *id,
                             const char *body, size_t len, attnd_job *job, attnd_error *e);

/* The 400 of a result that is not finite: the input's magnitudes did it
 * (a client error, not the server's). */
#define ATTND_MSG_OVERFLOW                                                                         \
    "query, key, value or attn_mask: values too large, the result overflows float32"

/* How the answer was produced, for "usage" and "parameters", and the
 * session fields of a session step's answer. */
typedef struct {
    int batch_requests;  /* requests in the compute batch this one shared */
    uint64_t queue_us;   /* admission to compute start */
    uint64_t compute_us; /* attn_forward of the batch */
    const char *session; /* a session step's id: "session" and "cached_tokens" come first in
                            the answer (v2: "session_id" and "cached_tokens", first in its
                            parameters); NULL for other requests. Borrowed */
    int cached_tokens;   /* the session's tokens after the step (with session) */
} attnd_usage;

/* Writes the 200 body for job (native or v2 as job->api says) from out
 * (B*L, E) and job->attn, whole, on the calling thread (answer.c, which
 * also writes answers over the compute pool: answer.h). *json_len is set
 * to the length of the JSON part when binary outputs follow it
 * (Inference-Header-Content-Length), else 0. Returns 0, or -1 when out of
 * memory. */
int attnd_write_answer(attnd_sbuf *b, const attnd_job *job, const attnd_model_info *model,
                       const float *out, const attnd_usage *u, size_t *json_len);

#endif
