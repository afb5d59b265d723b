/* calls.c - the gRPC calls answered at once (calls.h). */
#include "calls.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "../body/repo.h"
#include "../http/http.h"
#include "../models/registry.h"
#include "health.pb-c.h"
#include "inference.pb-c.h"

/* Any message packed into a new buffer: 0, or -1 with the 500. */
static int pack(const ProtobufCMessage *m, uint8_t **out, size_t *out_len, attnd_error *e) {
    *out_len = protobuf_c_message_get_packed_size(m);
    *out = malloc(*out_len ? *out_len : 1);
    if (!*out) return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    protobuf_c_message_pack(m, *out);
    return 0;
}

/* The 400 of a message that is not the call's. */
static int not_parsed(const char *what, attnd_error *e) {
    return attnd_set_error(e, AERR_BAD_REQUEST, "the message is not a %s (protobuf does not parse)",
                           what);
}

static int is_ready(const attnd_grpc *g) {
    return atomic_load(g->state) == S_READY;
}

int attnd_grpc_live(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out, size_t *out_len,
                    attnd_error *e) {
    (void)g, (void)msg, (void)len;
    Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
    r.live = 1;
    return pack(&r.base, out, out_len, e);
}

/* ServerReady answers ready: false while starting or draining (not an
 * error: the HTTP route's 503 is a probe's answer, this is the protocol's
 * field). */
int attnd_grpc_ready(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out, size_t *out_len,
                     attnd_error *e) {
    (void)msg, (void)len;
    Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
    r.ready = is_ready(g);
    return pack(&r.base, out, out_len, e);
}

/* The version serving of name, held, and whether version (when given) is
 * it; NULL with e set (404) otherwise. */
static attnd_version *named(attnd_grpc *g, const char *name, const char *version, attnd_error *e) {
    attnd_version *v = attnd_models_get(g->env->models, name ? name : "", e);
    if (!v || attnd_version_check(v, version, e) == 0) return v;
    attnd_version_unref(v);
    return NULL;
}

/* ModelReady: ready when the server is and the model (and version, when
 * given) serves; an unknown model is NOT_FOUND, as GET
 * /v2/models/{name}/ready is 404. */
int attnd_grpc_model_ready(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                           size_t *out_len, attnd_error *e) {
    Inference__ModelReadyRequest *rq = inference__model_ready_request__unpack(NULL, len, msg);
    if (!rq) return not_parsed("ModelReadyRequest", e);
    attnd_version *v = named(g, rq->name, rq->version, e);
    inference__model_ready_request__free_unpacked(rq, NULL);
    if (!v) return -1;
    attnd_version_unref(v);
    Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
    r.ready = is_ready(g);
    return pack(&r.base, out, out_len, e);
}

/* The strings of a JSON array (pointers into it), n of them. */
static char **strings_of(json_t *a, size_t *n) {
    *n = json_array_size(a);
    char **s = calloc(*n + 1, sizeof *s);
    for (size_t i = 0; s && i < *n; i++) {
        const char *v = json_string_value(json_array_get(a, i));
        s[i] = (char *)(v ? v : "");
    }
    return s;
}

/* ServerMetadata: GET /v2's body, name, version and extensions. */
int attnd_grpc_server_metadata(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                               size_t *out_len, attnd_error *e) {
    (void)msg, (void)len;
    json_t *j = json_loads(g->meta->v2, 0, NULL);
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    r.name = (char *)json_string_value(json_object_get(j, "name"));
    r.version = (char *)json_string_value(json_object_get(j, "version"));
    r.extensions = strings_of(json_object_get(j, "extensions"), &r.n_extensions);
    int rc = !r.name || !r.version || !r.extensions
                 ? attnd_set_error(e, AERR_INTERNAL, "out of memory")
                 : pack(&r.base, out, out_len, e);
    free(r.extensions);
    json_decref(j);
    return rc;
}

typedef Inference__ModelMetadataResponse__TensorMetadata TensorMeta;

/* The tensors of a metadata body's "inputs" or "outputs" into ts (n, and
 * pointers in ptrs; shapes in shapes, 8 a tensor). */
static void tensors_of(json_t *a, TensorMeta *ts, TensorMeta **ptrs, int64_t *shapes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i), *sh = json_object_get(t, "shape");
        inference__model_metadata_response__tensor_metadata__init(&ts[i]);
        ts[i].name = (char *)json_string_value(json_object_get(t, "name"));
        ts[i].datatype = (char *)json_string_value(json_object_get(t, "datatype"));
        ts[i].n_shape = json_array_size(sh) < 8 ? json_array_size(sh) : 8;
        ts[i].shape = shapes + 8 * i;
        for (size_t d = 0; d < ts[i].n_shape; d++)
            ts[i].shape[d] = json_integer_value(json_array_get(sh, d));
        ptrs[i] = &ts[i];
    }
}

/* A metadata body (GET /v2/models/{name}) as its message. */
static int metadata_message(json_t *j, uint8_t **out, size_t *out_len, attnd_error *e) {
    Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    json_t *ins = json_object_get(j, "inputs"), *outs = json_object_get(j, "outputs");
    size_t ni = json_array_size(ins), no = json_array_size(outs);
    TensorMeta *ts = calloc(ni + no + 1, sizeof *ts);
    TensorMeta **ptrs = calloc(ni + no + 1, sizeof *ptrs);
    int64_t *shapes = calloc(8 * (ni + no + 1), sizeof *shapes);
    r.name = (char *)json_string_value(json_object_get(j, "name"));
    r.platform = (char *)json_string_value(json_object_get(j, "platform"));
    r.versions = strings_of(json_object_get(j, "versions"), &r.n_versions);
    int rc = -1;
    if (ts && ptrs && shapes && r.versions && r.name) {
        tensors_of(ins, ts, ptrs, shapes, ni);
        tensors_of(outs, ts + ni, ptrs + ni, shapes + 8 * ni, no);
        r.n_inputs = ni, r.inputs = ptrs;
        r.n_outputs = no, r.outputs = ptrs + ni;
        rc = pack(&r.base, out, out_len, e);
    } else {
        attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    free(ts), free(ptrs), free(shapes), free(r.versions);
    return rc;
}

int attnd_grpc_model_metadata(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                              size_t *out_len, attnd_error *e) {
    Inference__ModelMetadataRequest *rq = inference__model_metadata_request__unpack(NULL, len, msg);
    if (!rq) return not_parsed("ModelMetadataRequest", e);
    attnd_version *v = named(g, rq->name, rq->version, e);
    inference__model_metadata_request__free_unpacked(rq, NULL);
    if (!v) return -1;
    char *body = attnd_meta_v2_model(&v->info);
    attnd_version_unref(v);
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    int rc = j ? metadata_message(j, out, out_len, e)
               : attnd_set_error(e, AERR_INTERNAL, "out of memory");
    json_decref(j);
    return rc;
}

/* The repository calls answer while model control is on and the server
 * serves: else the 403 or the 503 of the HTTP routes. */
static int control_allowed(const attnd_grpc *g, attnd_error *e) {
    if (!g->cfg->explicit_control)
        return attnd_set_error(e, AERR_FORBIDDEN,
                               "model control is off: set server.model_control to \"explicit\" "
                               "to load and unload models over the API (SIGHUP applies the "
                               "config file's models either way)");
    if (!is_ready(g)) return attnd_set_error(e, AERR_UNAVAILABLE, "draining");
    return 0;
}

typedef Inference__RepositoryIndexResponse__ModelIndex ModelIndex;

/* The index body (a JSON array of name, version, state, reason) as its
 * message. */
static int index_message(json_t *a, uint8_t **out, size_t *out_len, attnd_error *e) {
    size_t n = json_array_size(a);
    ModelIndex *ms = calloc(n + 1, sizeof *ms);
    ModelIndex **ptrs = calloc(n + 1, sizeof *ptrs);
    if (!ms || !ptrs) {
        free(ms), free(ptrs);
        return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(a, i);
        inference__repository_index_response__model_index__init(&ms[i]);
        const char *name = json_string_value(json_object_get(m, "name"));
        const char *version = json_string_value(json_object_get(m, "version"));
        const char *state = json_string_value(json_object_get(m, "state"));
        const char *reason = json_string_value(json_object_get(m, "reason"));
        ms[i].name = (char *)(name ? name : "");
        ms[i].version = (char *)(version ? version : "");
        ms[i].state = (char *)(state ? state : "");
        ms[i].reason = (char *)(reason ? reason : "");
        ptrs[i] = &ms[i];
    }
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    r.n_models = n;
    r.models = ptrs;
    int rc = pack(&r.base, out, out_len, e);
    free(ms), free(ptrs);
    return rc;
}

int attnd_grpc_repo_index(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                          size_t *out_len, attnd_error *e) {
    Inference__RepositoryIndexRequest *rq =
        inference__repository_index_request__unpack(NULL, len, msg);
    if (!rq) return not_parsed("RepositoryIndexRequest", e);
    int ready_only = rq->ready;
    inference__repository_index_request__free_unpacked(rq, NULL);
    if (control_allowed(g, e) < 0) return -1;
    size_t n = 0;
    char *body = attnd_models_index(g->env->models, ready_only, &n);
    json_t *j = body ? json_loadb(body, n, 0, NULL) : NULL;
    free(body);
    int rc =
        j ? index_message(j, out, out_len, e) : attnd_set_error(e, AERR_INTERNAL, "out of memory");
    json_decref(j);
    return rc;
}

typedef Inference__ModelRepositoryParameter RepoParameter;

/* One repository parameter's value as JSON: bytes as the text they hold
 * (a load's config may come as either), no value as null. */
static void put_repo_param(attnd_sbuf *b, const RepoParameter *p) {
    char *text = NULL;
    switch (p ? p->parameter_choice_case
              : INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE__NOT_SET) {
    case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        attnd_sb_puts(b, p->bool_param ? "true" : "false");
        break;
    case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        attnd_sb_printf(b, "%lld", (long long)p->int64_param);
        break;
    case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        attnd_sb_json_str(b, p->string_param ? p->string_param : "");
        break;
    case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BYTES_PARAM:
        text = strndup((const char *)p->bytes_param.data, p->bytes_param.len);
        if (text)
            attnd_sb_json_str(b, text);
        else
            b->oom = 1;
        free(text);
        break;
    default:
        attnd_sb_puts(b, "null");
    }
}

/* Parameter i (key: value) of a load's or an unload's, in the HTTP route's
 * body {"parameters": {...}}: every one of them goes, and the route's
 * reader refuses those it does not take, with its sentence. */
static void put_entry(attnd_sbuf *b, size_t i, const char *key, const RepoParameter *value) {
    attnd_sb_puts(b, i ? "," : "{\"parameters\":{");
    attnd_sb_json_str(b, key ? key : "");
    attnd_sb_putc(b, ':');
    put_repo_param(b, value);
}

/* The body's end: 0, or -1 with the 500 when out of memory. */
static int end_body(attnd_sbuf *b, size_t n, attnd_error *e) {
    attnd_sb_puts(b, n ? "}}" : "{\"parameters\":{}}");
    return b->oom ? attnd_set_error(e, AERR_INTERNAL, "out of memory") : 0;
}

static int unload_body(const Inference__RepositoryModelUnloadRequest *rq, attnd_sbuf *b,
                       attnd_error *e) {
    for (size_t i = 0; i < rq->n_parameters; i++)
        put_entry(b, i, rq->parameters[i]->key, rq->parameters[i]->value);
    return end_body(b, rq->n_parameters, e);
}

static int load_body(const Inference__RepositoryModelLoadRequest *rq, attnd_sbuf *b,
                     attnd_error *e) {
    for (size_t i = 0; i < rq->n_parameters; i++)
        put_entry(b, i, rq->parameters[i]->key, rq->parameters[i]->value);
    return end_body(b, rq->n_parameters, e);
}

/* The model is named by the message's model_name whole (HTTP's {name}): a
 * name over ATTND_NAME_MAX - 1 characters is the load's 400 or the
 * unload's 404, as over HTTP, never another model's shorter name. */
int attnd_grpc_repo_unload(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out,
                           size_t *out_len, attnd_error *e) {
    Inference__RepositoryModelUnloadRequest *rq =
        inference__repository_model_unload_request__unpack(NULL, len, msg);
    if (!rq) return not_parsed("RepositoryModelUnloadRequest", e);
    attnd_sbuf b;
    attnd_sb_init(&b);
    int rc = -1;
    if (control_allowed(g, e) == 0 && unload_body(rq, &b, e) == 0 &&
        attnd_repo_parse_unload(b.p, b.len, e) == 0)
        rc = attnd_models_unload(g->env->models, rq->model_name ? rq->model_name : "", e);
    attnd_sb_free(&b);
    inference__repository_model_unload_request__free_unpacked(rq, NULL);
    if (rc < 0) return -1;
    Inference__RepositoryModelUnloadResponse r = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
    return pack(&r.base, out, out_len, e);
}

int attnd_grpc_repo_load_entry(attnd_grpc *g, const uint8_t *msg, size_t len,
                               attnd_model_config *mc, attnd_error *e) {
    Inference__RepositoryModelLoadRequest *rq =
        inference__repository_model_load_request__unpack(NULL, len, msg);
    if (!rq) return not_parsed("RepositoryModelLoadRequest", e);
    const char *name = rq->model_name ? rq->model_name : "";
    attnd_sbuf b;
    attnd_sb_init(&b);
    int given = 0, rc = -1;
    memset(mc, 0, sizeof *mc);
    if (control_allowed(g, e) == 0 && load_body(rq, &b, e) == 0) {
        rc = attnd_repo_parse_load(b.p, b.len, name, g->cfg->model_dir, mc, &given, e);
        if (rc == 0 && !given && (rc = attnd_repo_file_entry(g->cfg, name, mc, e)) < 0)
            given = e->code != AERR_NOT_FOUND; /* a config file that fails: a failed load */
        if (rc < 0 && given) attnd_models_refused(g->env->models, name, e);
    }
    attnd_sb_free(&b);
    inference__repository_model_load_request__free_unpacked(rq, NULL);
    return rc;
}

int attnd_grpc_repo_load_answer(uint8_t **out, size_t *out_len) {
    Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
    attnd_error e;
    return pack(&r.base, out, out_len, &e);
}

/* The service a HealthCheckRequest names, read (the message freed) into
 * svc (cut at cap). 0, or -1 with e set. */
static int health_request(const uint8_t *msg, size_t len, char *svc, size_t cap, attnd_error *e) {
    Grpc__Health__V1__HealthCheckRequest *rq =
        grpc__health__v1__health_check_request__unpack(NULL, len, msg);
    if (!rq) return not_parsed("HealthCheckRequest", e);
    snprintf(svc, cap, "%s", rq->service ? rq->service : "");
    grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
    return 0;
}

static int served_service(const char *svc) {
    return !svc[0] || strcmp(svc, "inference.GRPCInferenceService") == 0;
}

int attnd_grpc_health_service(const uint8_t *msg, size_t len, int *known, attnd_error *e) {
    char svc[256];
    if (health_request(msg, len, svc, sizeof svc, e) < 0) return -1;
    *known = served_service(svc);
    return 0;
}

int attnd_grpc_health_status(const attnd_grpc *g, int known) {
    if (!known) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    return is_ready(g) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                       : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

int attnd_grpc_health_answer(int status, uint8_t **out, size_t *out_len, attnd_error *e) {
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    return pack(&r.base, out, out_len, e);
}

/* grpc.health.v1.Health/Check: SERVING while ready, NOT_SERVING while
 * starting or draining, for the server ("") and for
 * inference.GRPCInferenceService; any other service is NOT_FOUND, as the
 * health protocol asks (Watch answers it SERVICE_UNKNOWN instead). */
int attnd_grpc_health(attnd_grpc *g, const uint8_t *msg, size_t len, uint8_t **out, size_t *out_len,
                      attnd_error *e) {
    char svc[256];
    if (health_request(msg, len, svc, sizeof svc, e) < 0) return -1;
    if (!served_service(svc))
        return attnd_set_error(e, AERR_NOT_FOUND,
                               "unknown service '%.100s' (\"\" or "
                               "inference.GRPCInferenceService)",
                               svc);
    return attnd_grpc_health_answer(attnd_grpc_health_status(g, 1), out, out_len, e);
}

/* ---- the method table ---- */

const attnd_grpc_method attnd_grpc_methods[GM_COUNT] = {
    [GM_LIVE] = {"/inference.GRPCInferenceService/ServerLive", 1, attnd_grpc_live},
    [GM_READY] = {"/inference.GRPCInferenceService/ServerReady", 1, attnd_grpc_ready},
    [GM_MODEL_READY] = {"/inference.GRPCInferenceService/ModelReady", 0, attnd_grpc_model_ready},
    [GM_SERVER_METADATA] = {"/inference.GRPCInferenceService/ServerMetadata", 0,
                            attnd_grpc_server_metadata},
    [GM_MODEL_METADATA] = {"/inference.GRPCInferenceService/ModelMetadata", 0,
                           attnd_grpc_model_metadata},
    [GM_INFER] = {"/inference.GRPCInferenceService/ModelInfer", 0, NULL},
    [GM_STREAM_INFER] = {"/inference.GRPCInferenceService/ModelStreamInfer", 0, NULL},
    [GM_REPO_INDEX] = {"/inference.GRPCInferenceService/RepositoryIndex", 0, attnd_grpc_repo_index},
    [GM_REPO_LOAD] = {"/inference.GRPCInferenceService/RepositoryModelLoad", 0, NULL},
    [GM_REPO_UNLOAD] = {"/inference.GRPCInferenceService/RepositoryModelUnload", 0,
                        attnd_grpc_repo_unload},
    [GM_HEALTH_CHECK] = {"/grpc.health.v1.Health/Check", 1, attnd_grpc_health},
    [GM_HEALTH_WATCH] = {"/grpc.health.v1.Health/Watch", 1, NULL},
    [GM_UNKNOWN] = {"(unknown)", 1, NULL},
};

int attnd_grpc_method_of(const char *path, size_t n) {
    for (int i = 0; i < GM_UNKNOWN; i++)
        if (strlen(attnd_grpc_methods[i].path) == n &&
            memcmp(attnd_grpc_methods[i].path, path, n) == 0)
            return i;
    return GM_UNKNOWN;
}
