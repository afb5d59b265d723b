/* answer.h - the 200 bodies of computed requests, written on the compute
 * pool. A large answer's tensors are cut into chunks of numbers that the
 * pool's threads print at the same time, each into its own buffer, then
 * copy into place (base64 and binary chunks go straight into place); small
 * answers are written whole, one per task. The bytes are always those of
 * attnd_write_answer (request.h), the plain writer on one thread.
 * No HTTP and no locks in here; the threads are the caller's attn_ctx.
 */
#ifndef ATTND_ANSWER_H
#define ATTND_ANSWER_H

#include <stddef.h>

#include "../../core/attn.h"
#include "request.h"

/* Floats per chunk when a tensor is cut: JSON numbers (about 10 bytes of
 * text each), base64 (a multiple of 3, so that every chunk but the last
 * encodes without padding) and binary. An answer of one chunk or less is
 * written whole by attnd_write_answer. */
enum {
    ANSWER_TEXT_CHUNK = 16384,
    ANSWER_B64_CHUNK = 3 * 16384,
    ANSWER_RAW_CHUNK = 1 << 18,
};

/* One answer to write. */
typedef struct {
    /* in: borrowed until done() is called for this answer */
    const attnd_job *job; /* shapes, encoding, api, job->attn */
    const attnd_model_info *model;
    const float *out; /* (B*L, E) */
    attnd_usage usage;
    /* out: set before done() */
    char *body; /* malloc'd, NUL after body_len, the caller's; NULL when out of memory */
    size_t body_len;
    size_t json_len; /* as attnd_write_answer's *json_len */
} attnd_answer;

/* Writes the n answers over ctx's threads (the calling thread's alone when
 * ctx is NULL) and calls done(arg, i) once for each answer i, from any of
 * those threads, as soon as it is written. Returns when every answer is
 * done. */
void attnd_write_answers(attn_ctx *ctx, attnd_answer *a, int n, void (*done)(void *arg, int i),
                         void *arg);

/* The 201 body of a session opened without a prefix (cached_tokens 0) or
 * restored from a state file: its id, its model and its cached tokens.
 * NULL when out of memory. */
char *attnd_write_open_answer(const char *id, const char *model, int cached_tokens, size_t *len);

/* The v2 answer of parameters.session_close with no input: the model, the
 * session's id and "session_closed": true, no outputs. NULL when out of
 * memory. */
char *attnd_write_close_answer(const attnd_job *job, size_t *len);

#endif
