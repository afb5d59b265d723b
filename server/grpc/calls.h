/* calls.h - the gRPC calls answered at once, on the polling thread
 * (calls.c): liveness, readiness, health, the server's and a model's
 * metadata, the repository's index and unload, and the reading of a load's
 * message. Each reads its request message and writes its answer message
 * (packed, malloc'd) or refuses with an attnd_error, as the HTTP route of
 * the same name does, from the same bodies (body/meta.c, models/registry.c,
 * body/repo.c).
 */
#ifndef ATTND_GRPC_CALLS_H
#define ATTND_GRPC_CALLS_H

#include <stddef.h>
#include <stdint.h>

#include "../../config/weights.h"
#include "grpc.h"

/* A unary call's answer: a packed message, or a refusal in e. */
typedef int (*attnd_grpc_unary)(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                                size_t *out_len, attnd_error *e);

int attnd_grpc_live(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out, size_t *out_len,
                    attnd_error *e);
int attnd_grpc_ready(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out, size_t *out_len,
                     attnd_error *e);
int attnd_grpc_model_ready(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                           size_t *out_len, attnd_error *e);
int attnd_grpc_server_metadata(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                               size_t *out_len, attnd_error *e);
int attnd_grpc_model_metadata(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                              size_t *out_len, attnd_error *e);
int attnd_grpc_repo_index(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                          size_t *out_len, attnd_error *e);
int attnd_grpc_repo_unload(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                           size_t *out_len, attnd_error *e);
int attnd_grpc_health(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out, size_t *out_len,
                      attnd_error *e);

/* The methods served, by GM_*: each one's path, whether it needs the API
 * key, and its answer when it is a unary call answered at once. */
typedef struct {
    const char *path;
    int open; /* 1: answered without the API key: liveness, readiness and health, as the
                 /v2/health routes (ModelReady's twin, GET /v2/models/NAME/ready, needs it) */
    attnd_grpc_unary unary; /* answered at once; NULL: infer, streams or load */
} attnd_grpc_method;
extern const attnd_grpc_method attnd_grpc_methods[GM_COUNT];
/* The GM_* of a call's method path (n bytes), GM_UNKNOWN when none. */
int attnd_grpc_method_of(const char *path, size_t n);

/* grpc.health.v1: a HealthCheckRequest read, *known set to 1 when the
 * service it names is served ("" or inference.GRPCInferenceService). 0, or
 * -1 with e set (the message does not parse). */
int attnd_grpc_health_service(const uint8_t *msg, size_t len, int *known, attnd_error *e);
/* The HealthCheckResponse status now: SERVING or NOT_SERVING for a known
 * service, SERVICE_UNKNOWN for another. */
int attnd_grpc_health_status(const attnd_grpc *g, int known);
/* A HealthCheckResponse of status, packed. 0, or -1 with e set. */
int attnd_grpc_health_answer(int status, uint8_t **out, size_t *out_len, attnd_error *e);

/* A RepositoryModelLoad message read: the model's entry into mc (its
 * parameters' "config", or the config file's entry as on disk now), as
 * POST /v2/repository/models/{name}/load reads it. 0, or -1 with e set
 * (403 when model control is off, 503 when draining). */
int attnd_grpc_repo_load_entry(attnd_grpc *g, const uint8_t *msg, size_t len,
                               attnd_model_config *mc, attnd_error *e);
/* The empty RepositoryModelLoadResponse, packed. */
int attnd_grpc_repo_load_answer(uint8_t **out, size_t *out_len);

#endif
