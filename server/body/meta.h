/* meta.h - the bodies of the routes that only describe the server: GET
 * /v1/models (the models serving, the limits, batching and what
 * computes), GET /v2 (server metadata) and GET /v2/models/{name} (a
 * model's inputs and outputs in the Open Inference Protocol's terms;
 * docs/api.md). No HTTP.
 */
#ifndef ATTND_META_H
#define ATTND_META_H

#include "../../config/config.h"
#include "request.h"

typedef struct {
    char *v2; /* GET /v2; owned */
} attnd_meta;

/* Writes GET /v2's body. Returns 0, or -1 when out of memory. */
int attnd_meta_build(attnd_meta *m);
void attnd_meta_free(attnd_meta *m); /* zeroed is fine */

/* GET /v1/models for the n versions serving (vs, in slot order) and the
 * server settings of c; NULL when out of memory. */
char *attnd_meta_models(const attnd_config *c, attnd_version *const *vs, int n);
/* GET /v2/models/{name} of one version; NULL when out of memory. */
char *attnd_meta_v2_model(const attnd_model_info *info);

#endif
