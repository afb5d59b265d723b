/* test_server_grpc.c - the gRPC messages as the HTTP v2 bodies
 * (server/grpc/wire.c), without a socket:
 *
 *   codes      every refusal kind has the gRPC code of docs/api.md's table.
 *   raw        a ModelInferRequest with raw_input_contents reads into the
 *              job its v2 body reads into: same floats, masks, parameters.
 *   contents   fp32, fp64, bool and int64 contents read as raw bytes would;
 *              a datatype with no contents field, both forms at once, a
 *              count of raw entries that is not the inputs', no model name:
 *              each refused with the 400 naming the field.
 *   refusals   the v2 reader's sentences come through unchanged; a version
 *              other than the one serving is 404.
 *   answer     a v2 answer (JSON and binary outputs) becomes the
 *              ModelInferResponse that carries the same names, shapes,
 *              parameters and bytes; a stream's answer wraps it, or an error.
 *   close      session_close with a session id and no input is a close job.
 *   merge      a stream's plain steps of one session merge into one request
 *              of all their rows, in order (server/grpc/merge.c); a step
 *              with other parameters, contents, bytes not its shape's, or
 *              past the size given ends the run.
 *   split      a merged step's answer splits into one per step: its rows,
 *              its id, its cached_tokens; an answer of other rows is refused.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/body/v2.h"
#include "../server/grpc/merge.h"
#include "../server/grpc/wire.h"
#include "check_run.h"
#include "inference.pb-c.h"
#include "test_models.h"

static const attn_hparams SMALL = {.embed_dim = 4, .num_heads = 2, .kdim = 4, .vdim = 4, .bias = 1};
static attnd_models *g_models;

static void setup(void) {
    char err[512];
    g_models = attnd_models_new(0);
    ck_assert(g_models);
    attnd_model_config mc = test_model_entry("small", &SMALL, NULL);
    attnd_version *v = test_models_add(g_models, &mc, err, sizeof err);
    ck_assert_msg(v != NULL, "%s", err);
    attnd_version_unref(v);
}

static void teardown(void) {
    attnd_models_free(g_models);
    g_models = NULL;
}

static attnd_parse_env env(void) {
    return (attnd_parse_env){
        .models = g_models, .max_tokens_per_request = 1024, .max_attention_floats = 1 << 20};
}

/* ---- building requests ---- */

typedef Inference__ModelInferRequest Req;
typedef Inference__ModelInferRequest__InferInputTensor In;
typedef Inference__ModelInferRequest__ParametersEntry Param;

typedef struct {
    Req r;
    In in[4], *inp[4];
    int64_t shape[4][4];
    ProtobufCBinaryData raw[4];
    Inference__InferTensorContents contents[4];
    Param pe[4], *pep[4];
    Inference__InferParameter pv[4];
} req_builder;

static void rb_init(req_builder *b, const char *model) {
    memset(b, 0, sizeof *b);
    inference__model_infer_request__init(&b->r);
    b->r.model_name = (char *)model;
    b->r.inputs = b->inp;
    b->r.parameters = b->pep;
}

static In *rb_input(req_builder *b, const char *name, const char *dt, int rank,
                    const int64_t *shape) {
    size_t i = b->r.n_inputs++;
    In *in = &b->in[i];
    inference__model_infer_request__infer_input_tensor__init(in);
    in->name = (char *)name;
    in->datatype = (char *)dt;
    memcpy(b->shape[i], shape, (size_t)rank * sizeof *shape);
    in->shape = b->shape[i];
    in->n_shape = (size_t)rank;
    b->inp[i] = in;
    return in;
}

static void rb_raw(req_builder *b, const void *p, size_t n) {
    b->raw[b->r.n_raw_input_contents].data = (uint8_t *)p;
    b->raw[b->r.n_raw_input_contents++].len = n;
    b->r.raw_input_contents = b->raw;
}

static Inference__InferTensorContents *rb_contents(req_builder *b, In *in) {
    Inference__InferTensorContents *c = &b->contents[in - b->in];
    inference__infer_tensor_contents__init(c);
    in->contents = c;
    return c;
}

static void rb_param_str(req_builder *b, const char *key, const char *v) {
    size_t i = b->r.n_parameters++;
    inference__model_infer_request__parameters_entry__init(&b->pe[i]);
    inference__infer_parameter__init(&b->pv[i]);
    b->pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    b->pv[i].string_param = (char *)v;
    b->pe[i].key = (char *)key;
    b->pe[i].value = &b->pv[i];
    b->pep[i] = &b->pe[i];
}

static void rb_param_bool(req_builder *b, const char *key, int v) {
    rb_param_str(b, key, "");
    size_t i = b->r.n_parameters - 1;
    b->pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    b->pv[i].bool_param = v;
}

static void rb_param_int(req_builder *b, const char *key, int64_t v) {
    rb_param_str(b, key, "");
    size_t i = b->r.n_parameters - 1;
    b->pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    b->pv[i].int64_param = v;
}

static uint8_t *rb_pack(req_builder *b, size_t *len) {
    *len = inference__model_infer_request__get_packed_size(&b->r);
    uint8_t *p = malloc(*len + 1);
    ck_assert(p);
    inference__model_infer_request__pack(&b->r, p);
    return p;
}

/* Reads b's message into job: its return, e set on failure. */
static int parse(req_builder *b, attnd_job *job, attnd_error *e) {
    size_t len;
    uint8_t *msg = rb_pack(b, &len);
    attnd_parse_env en = env();
    attnd_grpc_target t;
    memset(e, 0, sizeof *e);
    int rc = attnd_grpc_parse_infer(&en, msg, len, &t, job, e);
    free(msg);
    return rc;
}

static const float Q[8] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f};
static const int64_t SHAPE_Q[3] = {1, 2, 4};

START_TEST(codes) {
    static const struct {
        attnd_kind k;
        int code;
    } want[] = {{AERR_BAD_REQUEST, GRPC_INVALID_ARGUMENT},
                {AERR_UNAUTHORIZED, GRPC_UNAUTHENTICATED},
                {AERR_NOT_FOUND, GRPC_NOT_FOUND},
                {AERR_TOO_LARGE, GRPC_RESOURCE_EXHAUSTED},
                {AERR_QUEUE_FULL, GRPC_RESOURCE_EXHAUSTED},
                {AERR_INTERNAL, GRPC_INTERNAL},
                {AERR_UNAVAILABLE, GRPC_UNAVAILABLE},
                {AERR_TIMEOUT, GRPC_DEADLINE_EXCEEDED},
                {AERR_CONFLICT, GRPC_ABORTED},
                {AERR_FORBIDDEN, GRPC_PERMISSION_DENIED},
                {AERR_NO_ROOM, GRPC_RESOURCE_EXHAUSTED},
                {AOK, GRPC_OK}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(attnd_grpc_code(want[i].k) == want[i].code, "%s: %s",
                      attnd_kind_reason(want[i].k),
                      attnd_grpc_code_name(attnd_grpc_code(want[i].k)));
    ck_assert_str_eq(attnd_grpc_code_name(GRPC_UNAUTHENTICATED), "UNAUTHENTICATED");
}
END_TEST

/* The job of the v2 JSON body with the same query and parameters. */
static void v2_job(attnd_job *job, const char *params) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"inputs\":[{\"name\":\"query\",\"shape\":[1,2,4],\"datatype\":\"FP32\",\"data\":"
             "[0.1,-0.2,0.3,0.4,-0.5,0.6,0.7,-0.8]},{\"name\":\"key_padding_mask\",\"shape\":[1,"
             "2],\"datatype\":\"BOOL\",\"data\":[false,true]}],\"parameters\":{%s}}",
             params);
    attnd_parse_env en = env();
    attnd_error e;
    ck_assert_msg(attnd_parse_v2(&en, "small", body, strlen(body), 0, job, &e) == 0, "%s", e.msg);
}

START_TEST(raw) {
    req_builder b;
    rb_init(&b, "small");
    rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    rb_raw(&b, Q, sizeof Q);
    static const int64_t kpm_shape[2] = {1, 2};
    static const uint8_t kpm[2] = {0, 1};
    rb_input(&b, "key_padding_mask", "BOOL", 2, kpm_shape);
    rb_raw(&b, kpm, 2);
    rb_param_str(&b, "attention", "heads");
    rb_param_bool(&b, "causal", 1);
    attnd_job job, ref;
    attnd_error e;
    ck_assert_msg(parse(&b, &job, &e) == 0, "%s", e.msg);
    v2_job(&ref, "\"attention\":\"heads\",\"causal\":true,\"binary_data_output\":true");
    ck_assert_int_eq(job.B, ref.B);
    ck_assert_int_eq(job.L, ref.L);
    ck_assert_int_eq(job.causal, 1);
    ck_assert_int_eq(job.weights, ATTN_WEIGHTS_HEADS);
    ck_assert_int_eq(job.v2_binary, ref.v2_binary);
    ck_assert(memcmp(job.query, ref.query, sizeof Q) == 0);
    ck_assert(job.kpm && memcmp(job.kpm, ref.kpm, 2) == 0);
    attnd_job_free(&job);
    attnd_job_free(&ref);
}
END_TEST

START_TEST(contents) {
    static const double q64[8] = {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8};
    static const protobuf_c_boolean kpm[2] = {0, 1};
    for (int use64 = 0; use64 < 2; use64++) {
        req_builder b;
        rb_init(&b, "small");
        Inference__InferTensorContents *c =
            rb_contents(&b, rb_input(&b, "query", use64 ? "FP64" : "FP32", 3, SHAPE_Q));
        if (use64)
            c->fp64_contents = (double *)q64, c->n_fp64_contents = 8;
        else
            c->fp32_contents = (float *)Q, c->n_fp32_contents = 8;
        static const int64_t kpm_shape[2] = {1, 2};
        c = rb_contents(&b, rb_input(&b, "key_padding_mask", "BOOL", 2, kpm_shape));
        c->bool_contents = (protobuf_c_boolean *)kpm, c->n_bool_contents = 2;
        attnd_job job, ref;
        attnd_error e;
        ck_assert_msg(parse(&b, &job, &e) == 0, "%s", e.msg);
        v2_job(&ref, "\"binary_data_output\":true");
        ck_assert(memcmp(job.query, ref.query, sizeof Q) == 0);
        ck_assert(job.kpm && memcmp(job.kpm, ref.kpm, 2) == 0);
        attnd_job_free(&job);
        attnd_job_free(&ref);
    }
}
END_TEST

/* b refused with a 400 (or code) whose sentence holds want. */
static void refused(req_builder *b, attnd_kind code, const char *want) {
    attnd_job job;
    attnd_error e;
    ck_assert_int_eq(parse(b, &job, &e), -1);
    ck_assert_msg(e.code == code, "%s", e.msg);
    ck_assert_msg(strstr(e.msg, want) != NULL, "'%s' lacks '%s'", e.msg, want);
}

START_TEST(contents_refused) {
    req_builder b;
    rb_init(&b, "small");
    rb_contents(&b, rb_input(&b, "query", "FP16", 3, SHAPE_Q));
    refused(&b, AERR_BAD_REQUEST, "inputs[0] (query).contents: FP16 has no contents field");
    rb_init(&b, "small");
    In *in = rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    rb_contents(&b, in);
    rb_raw(&b, Q, sizeof Q);
    refused(&b, AERR_BAD_REQUEST, "inputs[0].contents: given with raw_input_contents");
    rb_init(&b, "small");
    rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    rb_input(&b, "key", "FP32", 3, SHAPE_Q);
    rb_raw(&b, Q, sizeof Q);
    refused(&b, AERR_BAD_REQUEST, "raw_input_contents: 1 entries for 2 inputs");
    rb_init(&b, "small");
    rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    refused(&b, AERR_BAD_REQUEST, "inputs[0].contents: required (or raw_input_contents)");
    rb_init(&b, "");
    refused(&b, AERR_BAD_REQUEST, "model_name: required");
}
END_TEST

START_TEST(refusals) {
    req_builder b;
    rb_init(&b, "small");
    rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    rb_raw(&b, Q, sizeof Q - 4); /* one float short */
    refused(&b, AERR_BAD_REQUEST,
            "inputs[0] (query): binary_data_size 28 where shape and datatype need 32");
    rb_init(&b, "nosuch");
    rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    rb_raw(&b, Q, sizeof Q);
    refused(&b, AERR_NOT_FOUND, "nosuch");
    rb_init(&b, "small");
    b.r.model_version = "7";
    rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    rb_raw(&b, Q, sizeof Q);
    refused(&b, AERR_NOT_FOUND, "unknown version '7' of model 'small' (version 1 serves");
    static const float nan_q[8] = {0, 0, 0, 0, 0, 0, 0, NAN};
    rb_init(&b, "small");
    rb_input(&b, "query", "FP32", 3, SHAPE_Q);
    rb_raw(&b, nan_q, sizeof nan_q);
    refused(&b, AERR_BAD_REQUEST, "query");
    attnd_job job;
    attnd_error e;
    size_t n = 3;
    attnd_parse_env en = env();
    attnd_grpc_target t;
    ck_assert_int_eq(attnd_grpc_parse_infer(&en, (const uint8_t *)"\xff\xff\xff", n, &t, &job, &e),
                     -1);
    ck_assert_msg(strstr(e.msg, "not a ModelInferRequest") != NULL, "%s", e.msg);
}
END_TEST

START_TEST(answer) {
    static const char json[] =
        "{\"model_name\":\"small\",\"model_version\":\"3\",\"id\":\"r9\",\"parameters\":{"
        "\"session_id\":\"ab\",\"cached_tokens\":5,\"session_closed\":true},\"outputs\":[{\"name\":"
        "\"output\",\"datatype\":\"FP32\",\"shape\":[1,2,4],\"parameters\":{\"binary_data_size\":"
        "32}},{\"name\":\"attention\",\"datatype\":\"FP16\",\"shape\":[1,1,2,2],\"parameters\":{"
        "\"binary_data_size\":8}}]}";
    size_t jl = strlen(json);
    char body[sizeof json + 40];
    memcpy(body, json, jl);
    memcpy(body + jl, Q, 32);
    memcpy(body + jl + 32, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
    uint8_t *out = NULL;
    size_t n = 0;
    ck_assert_int_eq(attnd_grpc_infer_answer(body, jl + 40, jl, &out, &n), 0);
    Inference__ModelInferResponse *r = inference__model_infer_response__unpack(NULL, n, out);
    ck_assert(r);
    ck_assert_str_eq(r->model_name, "small");
    ck_assert_str_eq(r->model_version, "3");
    ck_assert_str_eq(r->id, "r9");
    ck_assert_int_eq(r->n_outputs, 2);
    ck_assert_int_eq(r->n_raw_output_contents, 2);
    ck_assert_str_eq(r->outputs[1]->datatype, "FP16");
    ck_assert_int_eq(r->outputs[0]->n_shape, 3);
    ck_assert_int_eq(r->outputs[0]->shape[2], 4);
    ck_assert(r->raw_output_contents[0].len == 32 &&
              memcmp(r->raw_output_contents[0].data, Q, 32) == 0);
    ck_assert(r->raw_output_contents[1].len == 8 && r->raw_output_contents[1].data[7] == 8);
    ck_assert_int_eq(r->n_parameters, 3);
    int seen = 0;
    for (size_t i = 0; i < r->n_parameters; i++) {
        const Inference__InferParameter *p = r->parameters[i]->value;
        if (strcmp(r->parameters[i]->key, "cached_tokens") == 0)
            seen += p->int64_param == 5;
        else if (strcmp(r->parameters[i]->key, "session_id") == 0)
            seen += strcmp(p->string_param, "ab") == 0;
        else if (strcmp(r->parameters[i]->key, "session_closed") == 0)
            seen += p->bool_param == 1;
    }
    ck_assert_int_eq(seen, 3);
    size_t sn = 0;
    uint8_t *s = attnd_grpc_stream_answer(out, n, &sn);
    Inference__ModelStreamInferResponse *sr =
        inference__model_stream_infer_response__unpack(NULL, sn, s);
    ck_assert(sr && sr->infer_response && strcmp(sr->infer_response->model_name, "small") == 0);
    inference__model_stream_infer_response__free_unpacked(sr, NULL);
    free(s);
    s = attnd_grpc_stream_error("inputs: an input named 'query' is required", "", "", &sn);
    sr = inference__model_stream_infer_response__unpack(NULL, sn, s);
    ck_assert(sr && !sr->infer_response);
    ck_assert_str_eq(sr->error_message, "inputs: an input named 'query' is required");
    inference__model_stream_infer_response__free_unpacked(sr, NULL);
    free(s);
    /* a refusal names its request when the request named itself */
    s = attnd_grpc_stream_error("no", "small", "req-7", &sn);
    sr = inference__model_stream_infer_response__unpack(NULL, sn, s);
    ck_assert(sr && sr->infer_response);
    ck_assert_str_eq(sr->error_message, "no");
    ck_assert_str_eq(sr->infer_response->model_name, "small");
    ck_assert_str_eq(sr->infer_response->id, "req-7");
    ck_assert_int_eq((int)sr->infer_response->n_outputs, 0);
    inference__model_stream_infer_response__free_unpacked(sr, NULL);
    free(s);
    inference__model_infer_response__free_unpacked(r, NULL);
    free(out);
    /* binary outputs that pass the body's end: refused, not read past */
    ck_assert_int_eq(attnd_grpc_infer_answer(body, jl + 39, jl, &out, &n), -1);
}
END_TEST

START_TEST(close_only) {
    req_builder b;
    rb_init(&b, "small");
    rb_param_str(&b, "session_id", "0123456789abcdef0123456789abcdef");
    rb_param_bool(&b, "session_close", 1);
    attnd_job job;
    attnd_error e;
    ck_assert_msg(parse(&b, &job, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(job.session_close, 1);
    ck_assert_ptr_null(job.query);
    ck_assert_str_eq(job.session_id, "0123456789abcdef0123456789abcdef");
    attnd_job_free(&job);
    rb_init(&b, "small");
    rb_param_bool(&b, "session_close", 1);
    refused(&b, AERR_BAD_REQUEST,
            "parameters.session_close: closes the session of parameters.session_id");
}
END_TEST

/* A plain step of session "s" with id: rows rows of 0, 1, 2, ... from row r0. */
static grpc_slice step_msg(int r0, int rows, const char *id, void (*edit)(req_builder *)) {
    static float q[64];
    for (int i = 0; i < 64; i++)
        q[i] = (float)i;
    req_builder b;
    rb_init(&b, "small");
    b.r.id = (char *)id;
    int64_t shape[3] = {1, rows, 4};
    rb_input(&b, "query", "FP32", 3, shape);
    rb_raw(&b, q + 4 * r0, (size_t)rows * 16);
    rb_param_str(&b, "session_id", "s");
    if (edit) edit(&b);
    size_t len;
    uint8_t *p = rb_pack(&b, &len);
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)p, len);
    free(p);
    return sl;
}

static void with_timeout(req_builder *b) {
    rb_param_int(b, "timeout_ms", 50);
}
static void with_attention(req_builder *b) {
    rb_param_str(b, "attention", "mean");
}
static void short_bytes(req_builder *b) {
    b->raw[0].len -= 4;
}
static void other_session(req_builder *b) {
    b->pv[0].string_param = "t";
}

/* How many of the four merge when the third is edited by edit. */
static int run_with_third(void (*edit)(req_builder *), size_t max) {
    grpc_slice m[4] = {step_msg(0, 1, "a", NULL), step_msg(1, 2, "b", NULL),
                       step_msg(3, 1, "c", edit), step_msg(4, 1, "d", NULL)};
    uint8_t *merged = NULL;
    size_t len = 0;
    attnd_grpc_merge plan;
    memset(&plan, 0, sizeof plan);
    int k = attnd_grpc_merge_steps(m, 4, max, &merged, &len, &plan);
    free(merged);
    attnd_grpc_merge_free(&plan);
    for (int i = 0; i < 4; i++)
        grpc_slice_unref(m[i]);
    return k;
}

START_TEST(merge) {
    grpc_slice m[4] = {step_msg(0, 1, "a", NULL), step_msg(1, 2, "b", NULL),
                       step_msg(3, 1, NULL, NULL), step_msg(4, 1, "d", NULL)};
    uint8_t *merged = NULL;
    size_t len = 0;
    attnd_grpc_merge plan;
    memset(&plan, 0, sizeof plan);
    ck_assert_int_eq(attnd_grpc_merge_steps(m, 4, 1 << 20, &merged, &len, &plan), 4);
    ck_assert_int_eq(plan.n, 4);
    int rows[4] = {1, 2, 1, 1};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(plan.rows[i], rows[i]);
    ck_assert(plan.ids[0] && strcmp(plan.ids[0], "a") == 0 && !plan.ids[2]);
    attnd_parse_env en = env();
    attnd_grpc_target t;
    attnd_job job;
    attnd_error e;
    ck_assert_msg(attnd_grpc_parse_infer(&en, merged, len, &t, &job, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(job.L, 5);
    ck_assert_str_eq(job.session_id, "s");
    for (int i = 0; i < 20; i++) /* rows 0..4 of step_msg's q, in order */
        ck_assert(job.query[i] == (float)i);
    attnd_job_free(&job);
    free(merged);
    attnd_grpc_merge_free(&plan);
    ck_assert_int_eq(attnd_grpc_merge_steps(m, 1, 1 << 20, &merged, &len, &plan), 1);
    for (int i = 0; i < 4; i++)
        grpc_slice_unref(m[i]);
    ck_assert_int_eq(run_with_third(NULL, 1 << 20), 4);
    ck_assert_int_eq(run_with_third(with_timeout, 1 << 20), 2);
    ck_assert_int_eq(run_with_third(with_attention, 1 << 20), 2);
    ck_assert_int_eq(run_with_third(short_bytes, 1 << 20), 2);
    ck_assert_int_eq(run_with_third(other_session, 1 << 20), 2);
    ck_assert_int_eq(run_with_third(NULL, 40), 1); /* two messages pass 40 bytes */
}
END_TEST

START_TEST(split) {
    static const char json[] =
        "{\"model_name\":\"small\",\"model_version\":\"1\",\"parameters\":{\"session_id\":\"s\","
        "\"cached_tokens\":10},\"outputs\":[{\"name\":\"output\",\"datatype\":\"FP32\","
        "\"shape\":[1,3,4],\"parameters\":{\"binary_data_size\":48}}]}";
    float rows[12];
    for (int i = 0; i < 12; i++)
        rows[i] = (float)i;
    size_t jl = strlen(json);
    char body[sizeof json + 48];
    memcpy(body, json, jl);
    memcpy(body + jl, rows, 48);
    uint8_t *resp = NULL, *outs[ATTND_GRPC_MERGE_MAX];
    size_t n = 0, lens[ATTND_GRPC_MERGE_MAX];
    ck_assert_int_eq(attnd_grpc_infer_answer(body, jl + 48, jl, &resp, &n), 0);
    attnd_grpc_merge plan = {.n = 2, .rows = {1, 2}, .ids = {strdup("x"), NULL}};
    ck_assert_int_eq(attnd_grpc_merge_split(resp, n, &plan, outs, lens), 0);
    for (int i = 0; i < 2; i++) {
        Inference__ModelStreamInferResponse *sr =
            inference__model_stream_infer_response__unpack(NULL, lens[i], outs[i]);
        ck_assert(sr && sr->infer_response);
        const Inference__ModelInferResponse *r = sr->infer_response;
        ck_assert_str_eq(r->id, i ? "" : "x");
        ck_assert_int_eq(r->outputs[0]->shape[1], plan.rows[i]);
        ck_assert(r->raw_output_contents[0].len == (size_t)plan.rows[i] * 16);
        ck_assert(memcmp(r->raw_output_contents[0].data, rows + 4 * i, 16 * plan.rows[i]) == 0);
        for (size_t k = 0; k < r->n_parameters; k++)
            if (strcmp(r->parameters[k]->key, "cached_tokens") == 0)
                ck_assert_int_eq(r->parameters[k]->value->int64_param, i ? 10 : 8);
        inference__model_stream_infer_response__free_unpacked(sr, NULL);
        free(outs[i]);
    }
    plan.rows[1] = 3; /* 4 rows planned, 3 answered */
    ck_assert_int_eq(attnd_grpc_merge_split(resp, n, &plan, outs, lens), -1);
    attnd_grpc_merge_free(&plan);
    free(resp);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_grpc");
    TCase *t = tcase_create("server_grpc");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, codes);
    tcase_add_test(t, raw);
    tcase_add_test(t, contents);
    tcase_add_test(t, contents_refused);
    tcase_add_test(t, refusals);
    tcase_add_test(t, answer);
    tcase_add_test(t, close_only);
    tcase_add_test(t, merge);
    tcase_add_test(t, split);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(suite());
}
