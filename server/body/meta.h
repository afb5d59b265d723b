/* meta.h - the bodies of the routes that only describe the server, written
 * once at start-up and served as they are: GET /v1/models (the models as
 * loaded, the limits, batching and what computes), GET /v2 (server
 * metadata) and GET /v2/models/{name} (each model's inputs and outputs in
 * the Open Inference Protocol's terms; docs/api.md). No HTTP.
 */
#ifndef ATTND_META_H
#define ATTND_META_H

#include "../../config/config.h"
#include "request.h"

typedef struct {
    char *models;    /* GET /v1/models; owned */
    char *v2;        /* GET /v2; owned */
    char **v2_model; /* (n_models) GET /v2/models/{name}; owned */
    int n_models;
} attnd_meta;

/* Writes every body for the n_models models of c (info: their names and
 * hyper-parameters as loaded, num_kv_heads and head_dim filled in).
 * Returns 0, or -1 when out of memory (m holds what was written: free it). */
int attnd_meta_build(attnd_meta *m, const attnd_config *c, const attnd_model_info *info,
                     int n_models);
void attnd_meta_free(attnd_meta *m); /* zeroed is fine */

#endif
