/* v2.h - the Open Inference Protocol (KServe v2) body's reader (v2.c):
 * POST /v2/models/{name}/infer into one checked attnd_job (job.h), the
 * binary data extension and a session's open and steps included. No HTTP.
 */
#ifndef ATTND_V2_H
#define ATTND_V2_H

#include <stddef.h>

#include "../base/reply.h"
#include "job.h"

/* Reads an Open Inference Protocol infer body for the model path_model.
 * json_len is the Inference-Header-Content-Length of the binary data
 * extension (the JSON part; the inputs' bytes follow it), 0 when the whole
 * body is JSON. Returns 0, or -1 with e set (400, 404, 413, 500); job
 * holds nothing to free after a failure. */
int attnd_parse_v2(const attnd_parse_env *env, const char *path_model, const char *body, size_t len,
                   size_t json_len, attnd_job *job, attnd_error *e);

#endif
