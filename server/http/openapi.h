/* openapi.h - GET /openapi.json: the OpenAPI 3 document of the daemon as
 * it runs. server/http/openapi.json (embedded at build time) describes
 * every route; the answer is that document fitted to this daemon: the
 * bearer key's security requirement only when a key is set, and one path
 * of its own per model serving, whose request schemas say the model's
 * widths, heads and the datatypes and ranks of its v2 inputs. No HTTP.
 */
#ifndef ATTND_OPENAPI_H
#define ATTND_OPENAPI_H

#include <stddef.h>

#include "../models/version.h"

/* The document for a daemon with a key (keyed 1) or without, serving the
 * n versions vs; *len its length. NULL when out of memory. */
char *attnd_openapi_doc(int keyed, attnd_version *const *vs, int n, size_t *len);

#endif
