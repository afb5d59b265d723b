/* wire.c - gRPC messages as the HTTP v2 routes' bodies (wire.h). */
#include "wire.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "../body/v2.h"
#include "../models/registry.h"
#include "inference.pb-c.h"

typedef Inference__ModelInferRequest InferRequest;
typedef Inference__ModelInferRequest__InferInputTensor InferInput;
typedef Inference__InferParameter InferParameter;

int attnd_grpc_code(attnd_kind k) {
    switch (k) {
    case AERR_BAD_REQUEST:
        return GRPC_INVALID_ARGUMENT;
    case AERR_UNAUTHORIZED:
        return GRPC_UNAUTHENTICATED;
    case AERR_NOT_FOUND:
        return GRPC_NOT_FOUND;
    case AERR_METHOD:
        return GRPC_UNIMPLEMENTED;
    case AERR_TOO_LARGE:
    case AERR_QUEUE_FULL:
    case AERR_NO_ROOM:
        return GRPC_RESOURCE_EXHAUSTED;
    case AERR_UNAVAILABLE:
        return GRPC_UNAVAILABLE;
    case AERR_TIMEOUT:
        return GRPC_DEADLINE_EXCEEDED;
    case AERR_CONFLICT:
        return GRPC_ABORTED;
    case AERR_FORBIDDEN:
        return GRPC_PERMISSION_DENIED;
    case AERR_INTERNAL:
        return GRPC_INTERNAL;
    default:
        return attnd_kind_is_error(k) ? GRPC_UNKNOWN : GRPC_OK;
    }
}

static const char *const CODE_NAMES[GRPC_CODES] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

const char *attnd_grpc_code_name(int code) {
    return code >= 0 && code < GRPC_CODES ? CODE_NAMES[code] : "UNKNOWN";
}

/* ---- ModelInferRequest -> the v2 body ---- */

/* A string of the message as a JSON string: protobuf-c does not check
 * UTF-8, and the JSON writer makes any bytes valid. */
static void put_str(attnd_sbuf *b, const char *s) {
    attnd_sb_json_str(b, s ? s : "");
}

/* One parameter's value as JSON. */
static void put_param(attnd_sbuf *b, const InferParameter *p) {
    switch (p ? p->parameter_choice_case : INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE__NOT_SET) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        attnd_sb_puts(b, p->bool_param ? "true" : "false");
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        attnd_sb_printf(b, "%lld", (long long)p->int64_param);
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        attnd_sb_printf(b, "%llu", (unsigned long long)p->uint64_param);
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        attnd_sb_printf(b, "%.17g", p->double_param); /* not finite: the reader refuses it */
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        put_str(b, p->string_param);
        break;
    default:
        attnd_sb_puts(b, "null");
    }
}

/* The request's parameters, every output asked for in binary (the answer
 * carries raw_output_contents only). */
static void put_parameters(attnd_sbuf *b, const InferRequest *rq) {
    attnd_sb_puts(b, ",\"parameters\":{\"binary_data_output\":true");
    for (size_t i = 0; i < rq->n_parameters; i++) {
        const char *key = rq->parameters[i]->key ? rq->parameters[i]->key : "";
        if (strcmp(key, "binary_data_output") == 0) continue;
        attnd_sb_putc(b, ',');
        put_str(b, key);
        attnd_sb_putc(b, ':');
        put_param(b, rq->parameters[i]->value);
    }
    attnd_sb_putc(b, '}');
}

/* The contents fields of a datatype that has one ("" for the others):
 * the field, its count and values. */
typedef struct {
    const char *field;
    size_t n;
    const void *values;
    size_t size; /* bytes a value on the wire; 1 for BOOL, written a byte a value */
} contents_field;

static void contents_fields(const Inference__InferTensorContents *c, contents_field f[8]) {
    f[0] = (contents_field){"bool_contents", c->n_bool_contents, c->bool_contents, 1};
    f[1] = (contents_field){"int_contents", c->n_int_contents, c->int_contents, 4};
    f[2] = (contents_field){"int64_contents", c->n_int64_contents, c->int64_contents, 8};
    f[3] = (contents_field){"uint_contents", c->n_uint_contents, c->uint_contents, 4};
    f[4] = (contents_field){"uint64_contents", c->n_uint64_contents, c->uint64_contents, 8};
    f[5] = (contents_field){"fp32_contents", c->n_fp32_contents, c->fp32_contents, 4};
    f[6] = (contents_field){"fp64_contents", c->n_fp64_contents, c->fp64_contents, 8};
    f[7] = (contents_field){"bytes_contents", c->n_bytes_contents, NULL, 0};
}

/* The values of input i in its datatype's contents field: *data and *n
 * (bytes), *bools 1 for BOOL. 0, or -1 with the 400 of a datatype that
 * travels raw only, of values in another type's field, or of a count that
 * is not the shape's. */
static int contents_bytes(const InferInput *in, int i, const void **data, size_t *n, int *bools,
                          attnd_error *e) {
    static const char *const TYPES[] = {"BOOL", "INT32", "INT64", "", "", "FP32", "FP64"};
    const char *dt = in->datatype ? in->datatype : "", *name = in->name ? in->name : "";
    contents_field f[8];
    contents_fields(in->contents, f);
    const int nt = (int)(sizeof TYPES / sizeof TYPES[0]);
    int k = 0;
    while (k < nt && (!TYPES[k][0] || strcmp(TYPES[k], dt) != 0))
        k++;
    if (k == nt)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%.40s).contents: %.16s has no contents field; send it "
                               "in raw_input_contents",
                               i, name, dt);
    for (int j = 0; j < 8; j++)
        if (j != k && f[j].n)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "inputs[%d] (%.40s).contents.%s: %s values go in %s", i, name,
                                   f[j].field, dt, f[k].field);
    long long want = 1; /* -1: a shape the v2 reader refuses itself */
    for (size_t d = 0; d < in->n_shape && want >= 0; d++) {
        long long dim = in->shape[d];
        want = dim < 0 || (dim && want > (1LL << 40) / dim) ? -1 : want * dim;
    }
    if (want >= 0 && (long long)f[k].n != want)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%.40s).contents.%s: %zu values where the shape needs "
                               "%lld",
                               i, name, f[k].field, f[k].n, want);
    *data = f[k].values;
    *n = f[k].n * f[k].size;
    *bools = k == 0;
    return 0;
}

/* Where input i's bytes are, little-endian as the binary data extension
 * carries them: raw_input_contents[i], or its datatype's contents field
 * (BOOL's one byte a value is made when written: *bools 1). 0, or -1
 * with the 400 of contents beside raw_input_contents, or of contents that
 * do not read (contents_bytes). */
static int input_bytes(const InferRequest *rq, int i, const void **data, size_t *n, int *bools,
                       attnd_error *e) {
    const Inference__InferTensorContents *c = rq->inputs[i]->contents;
    *data = NULL;
    *bools = 0;
    if (!rq->n_raw_input_contents && !c)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d].contents: required (or raw_input_contents)", i);
    if (!rq->n_raw_input_contents) return contents_bytes(rq->inputs[i], i, data, n, bools, e);
    if (c)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d].contents: given with raw_input_contents (one or the "
                               "other, for every input)",
                               i);
    *data = rq->raw_input_contents[i].data;
    *n = rq->raw_input_contents[i].len;
    return 0;
}

/* Input i's bytes appended to b. */
static void put_input_bytes(attnd_sbuf *b, const InferRequest *rq, int i) {
    const void *data;
    size_t n;
    int bools;
    attnd_error e;
    input_bytes(rq, i, &data, &n, &bools, &e); /* put_input took it: no refusal now */
    if (!bools) {
        attnd_sb_put(b, data, n); /* data NULL only for n 0 */
        return;
    }
    const Inference__InferTensorContents *c = rq->inputs[i]->contents;
    for (size_t k = 0; k < c->n_bool_contents; k++)
        attnd_sb_putc(b, c->bool_contents[k] ? 1 : 0);
}

/* One input's JSON; its bytes' size added to *bytes. */
static int put_input(attnd_sbuf *b, size_t *bytes, const InferRequest *rq, int i, attnd_error *e) {
    const InferInput *in = rq->inputs[i];
    const void *data;
    size_t n = 0;
    int bools;
    if (input_bytes(rq, i, &data, &n, &bools, e) < 0) return -1;
    *bytes += n;
    attnd_sb_puts(b, i ? ",{\"name\":" : "{\"name\":");
    put_str(b, in->name);
    attnd_sb_puts(b, ",\"datatype\":");
    put_str(b, in->datatype);
    attnd_sb_puts(b, ",\"shape\":[");
    for (size_t d = 0; d < in->n_shape; d++)
        attnd_sb_printf(b, d ? ",%lld" : "%lld", (long long)in->shape[d]);
    attnd_sb_printf(b, "],\"parameters\":{\"binary_data_size\":%zu}}", n);
    return 0;
}

/* The JSON part of the request; *bytes: the size of its inputs' bytes. */
static int put_request(attnd_sbuf *b, size_t *bytes, const InferRequest *rq, attnd_error *e) {
    if (rq->n_raw_input_contents && rq->n_raw_input_contents != rq->n_inputs)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "raw_input_contents: %zu entries for %zu inputs (one per input, in "
                               "their order)",
                               rq->n_raw_input_contents, rq->n_inputs);
    attnd_sb_puts(b, "{\"inputs\":[");
    for (size_t i = 0; i < rq->n_inputs; i++)
        if (put_input(b, bytes, rq, (int)i, e) < 0) return -1;
    attnd_sb_puts(b, "],\"outputs\":[");
    for (size_t i = 0; i < rq->n_outputs; i++) {
        attnd_sb_puts(b, i ? ",{\"name\":" : "{\"name\":");
        put_str(b, rq->outputs[i]->name);
        attnd_sb_putc(b, '}');
    }
    attnd_sb_putc(b, ']');
    if (rq->id && rq->id[0]) {
        attnd_sb_puts(b, ",\"id\":");
        put_str(b, rq->id);
    }
    put_parameters(b, rq);
    attnd_sb_putc(b, '}');
    return 0;
}

/* The message's model name and version into t: 0, or -1 with the 400 of
 * no name. */
static int read_target(const InferRequest *rq, attnd_grpc_target *t, attnd_error *e) {
    if (rq->id && strlen(rq->id) < sizeof t->id) snprintf(t->id, sizeof t->id, "%s", rq->id);
    const char *name = rq->model_name ? rq->model_name : "";
    if (!name[0]) return attnd_set_error(e, AERR_BAD_REQUEST, "model_name: required");
    if (strlen(name) >= sizeof t->model)
        return attnd_set_error(e, AERR_NOT_FOUND, "unknown model '%.63s...'", name);
    snprintf(t->model, sizeof t->model, "%s", name);
    const char *v = rq->model_version ? rq->model_version : "";
    if (strlen(v) >= sizeof t->version)
        return attnd_set_error(e, AERR_NOT_FOUND, "unknown version '%.20s...' of model '%s'", v,
                               t->model);
    snprintf(t->version, sizeof t->version, "%s", v);
    return 0;
}

int attnd_grpc_infer_body(const uint8_t *msg, size_t len, attnd_grpc_target *t, attnd_sbuf *b,
                          size_t *json_len, attnd_error *e) {
    memset(t, 0, sizeof *t);
    InferRequest *rq = inference__model_infer_request__unpack(NULL, len, msg);
    if (!rq)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "the message is not a ModelInferRequest (protobuf does not parse)");
    size_t bytes = 0;
    int rc = read_target(rq, t, e) < 0 || put_request(b, &bytes, rq, e) < 0 ? -1 : 0;
    if (rc == 0) { /* the bytes after the JSON, in one buffer sized once */
        *json_len = b->len;
        if (attnd_sb_reserve(b, bytes) == 0)
            for (size_t i = 0; i < rq->n_inputs; i++)
                put_input_bytes(b, rq, (int)i);
        if (b->oom) rc = attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    inference__model_infer_request__free_unpacked(rq, NULL);
    return rc;
}

/* The version the message named against the one job computes on: 0, or -1
 * with the 404 (and job freed). */
static int check_version(const attnd_grpc_target *t, attnd_job *job, attnd_error *e) {
    if (!job->ver || attnd_version_check(job->ver, t->version, e) == 0) return 0;
    attnd_job_free(job);
    return -1;
}

int attnd_grpc_parse_infer(const attnd_parse_env *env, const uint8_t *msg, size_t len,
                           attnd_grpc_target *t, attnd_job *job, attnd_error *e) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    size_t json_len = 0;
    memset(job, 0, sizeof *job);
    int rc = attnd_grpc_infer_body(msg, len, t, &b, &json_len, e);
    if (rc == 0) {
        /* a body with no input bytes is JSON alone: json_len 0 says so */
        rc = attnd_parse_v2(env, t->model, b.p, b.len, json_len == b.len ? 0 : json_len, job, e);
        if (rc == 0) rc = check_version(t, job, e);
    }
    attnd_sb_free(&b);
    return rc;
}

/* ---- the v2 answer -> ModelInferResponse ---- */

typedef Inference__ModelInferResponse InferResponse;
typedef Inference__ModelInferResponse__InferOutputTensor OutputTensor;
typedef Inference__ModelInferResponse__ParametersEntry ParamEntry;

/* What a response built from JSON holds besides the JSON: freed together. */
typedef struct {
    InferResponse r;
    OutputTensor *outs;
    OutputTensor **out_ptrs;
    int64_t *shapes;
    ProtobufCBinaryData *raw;
    ParamEntry *entries;
    ParamEntry **entry_ptrs;
    InferParameter *values;
} built_response;

static void built_free(built_response *b) {
    free(b->outs);
    free(b->out_ptrs);
    free(b->shapes);
    free(b->raw);
    free(b->entries);
    free(b->entry_ptrs);
    free(b->values);
}

/* The answer's parameters (session_id, cached_tokens, batch, queue_us,
 * compute_us, ...): strings, integers, booleans, numbers. Strings point
 * into the JSON, which outlives the message. */
static int build_params(built_response *b, json_t *params) {
    size_t n = json_is_object(params) ? json_object_size(params) : 0, k = 0;
    b->entries = calloc(n + 1, sizeof *b->entries);
    b->entry_ptrs = calloc(n + 1, sizeof *b->entry_ptrs);
    b->values = calloc(n + 1, sizeof *b->values);
    if (!b->entries || !b->entry_ptrs || !b->values) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(params, key, v) {
        ParamEntry *en = &b->entries[k];
        InferParameter *p = &b->values[k];
        inference__model_infer_response__parameters_entry__init(en);
        inference__infer_parameter__init(p);
        en->key = (char *)key;
        en->value = p;
        if (json_is_boolean(v)) {
            p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
            p->bool_param = json_is_true(v);
        } else if (json_is_integer(v)) {
            p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
            p->int64_param = json_integer_value(v);
        } else if (json_is_real(v)) {
            p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
            p->double_param = json_real_value(v);
        } else if (json_is_string(v)) {
            p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
            p->string_param = (char *)json_string_value(v);
        } else {
            continue;
        }
        b->entry_ptrs[k++] = en;
    }
    b->r.n_parameters = k;
    b->r.parameters = b->entry_ptrs;
    return 0;
}

/* Output i of the JSON, its bytes the next *taken of bin (len left). */
static int build_output(built_response *b, size_t i, json_t *o, const char *bin, size_t *off,
                        size_t len, int64_t *shape) {
    OutputTensor *t = &b->outs[i];
    inference__model_infer_response__infer_output_tensor__init(t);
    t->name = (char *)json_string_value(json_object_get(o, "name"));
    t->datatype = (char *)json_string_value(json_object_get(o, "datatype"));
    json_t *sh = json_object_get(o, "shape");
    size_t nd = json_array_size(sh);
    if (!t->name || !t->datatype || nd > 8) return -1;
    for (size_t d = 0; d < nd; d++)
        shape[d] = json_integer_value(json_array_get(sh, d));
    t->n_shape = nd;
    t->shape = shape;
    json_t *size = json_object_get(json_object_get(o, "parameters"), "binary_data_size");
    if (!json_is_integer(size) || (size_t)json_integer_value(size) > len - *off) return -1;
    b->raw[i].data = (uint8_t *)bin + *off;
    b->raw[i].len = (size_t)json_integer_value(size);
    *off += b->raw[i].len;
    b->out_ptrs[i] = t;
    return 0;
}

static int build_outputs(built_response *b, json_t *outs, const char *bin, size_t len) {
    size_t n = json_array_size(outs), off = 0;
    b->outs = calloc(n + 1, sizeof *b->outs);
    b->out_ptrs = calloc(n + 1, sizeof *b->out_ptrs);
    b->raw = calloc(n + 1, sizeof *b->raw);
    b->shapes = calloc(8 * (n + 1), sizeof *b->shapes);
    if (!b->outs || !b->out_ptrs || !b->raw || !b->shapes) return -1;
    for (size_t i = 0; i < n; i++)
        if (build_output(b, i, json_array_get(outs, i), bin, &off, len, b->shapes + 8 * i) < 0)
            return -1;
    b->r.n_outputs = b->r.n_raw_output_contents = n;
    b->r.outputs = b->out_ptrs;
    b->r.raw_output_contents = b->raw;
    return 0;
}

static int pack_response(built_response *b, uint8_t **out, size_t *out_len) {
    *out_len = inference__model_infer_response__get_packed_size(&b->r);
    *out = malloc(*out_len ? *out_len : 1);
    if (!*out) return -1;
    inference__model_infer_response__pack(&b->r, *out);
    return 0;
}

int attnd_grpc_infer_answer(const char *body, size_t len, size_t json_len, uint8_t **out,
                            size_t *out_len) {
    size_t jl = json_len ? json_len : len;
    json_t *j = json_loadb(body, jl, 0, NULL);
    built_response b;
    memset(&b, 0, sizeof b);
    inference__model_infer_response__init(&b.r);
    int rc = -1;
    if (json_is_object(j)) {
        b.r.model_name = (char *)json_string_value(json_object_get(j, "model_name"));
        b.r.model_version = (char *)json_string_value(json_object_get(j, "model_version"));
        const char *id = json_string_value(json_object_get(j, "id"));
        if (id) b.r.id = (char *)id;
        if (!b.r.model_name) b.r.model_name = "";
        if (!b.r.model_version) b.r.model_version = "";
        if (build_params(&b, json_object_get(j, "parameters")) == 0 &&
            build_outputs(&b, json_object_get(j, "outputs"), body + jl, len - jl) == 0)
            rc = pack_response(&b, out, out_len);
    }
    built_free(&b);
    json_decref(j);
    return rc;
}

/* One length-delimited field's key and length (protobuf's wire format). */
static size_t put_field_head(uint8_t *p, int field, size_t n) {
    size_t k = 0;
    p[k++] = (uint8_t)(field << 3 | 2);
    do {
        p[k++] = (uint8_t)((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
        n >>= 7;
    } while (n);
    return k;
}

uint8_t *attnd_grpc_stream_answer(const uint8_t *resp, size_t n, size_t *out_len) {
    uint8_t *out = malloc(n + 16);
    if (!out) return NULL;
    size_t k = put_field_head(out, 2, n); /* infer_response is field 2 */
    memcpy(out + k, resp, n);
    *out_len = k + n;
    return out;
}

uint8_t *attnd_grpc_stream_error(const char *error, const char *model, const char *id,
                                 size_t *out_len) {
    Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    r.model_name = (char *)model;
    r.id = (char *)id;
    s.error_message = (char *)error;
    s.infer_response = model[0] || id[0] ? &r : NULL;
    uint8_t *out = malloc(inference__model_stream_infer_response__get_packed_size(&s) + 1);
    if (out) *out_len = inference__model_stream_infer_response__pack(&s, out);
    return out;
}

void attnd_grpc_error_text(const char *body, size_t len, char *msg, size_t cap) {
    json_t *j = body ? json_loadb(body, len, 0, NULL) : NULL;
    const char *s = json_string_value(json_object_get(j, "error"));
    snprintf(msg, cap, "%s", s ? s : "internal error");
    json_decref(j);
}
