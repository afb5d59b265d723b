/* test_server_pipeline.c - the one compute road without HTTP and without
 * the scheduler's threads: bodies parsed the daemon's way, admitted
 * (server/batch/admit.c: the session dispatch of every API, X-Session-Id
 * given as a plain string) and run through server/batch/pipeline.c. A
 * KV-cache session step and a whole sequence share one batch and each
 * answers what it answers alone (the step: the same rows of the whole
 * sequence, causal, from the naive reference); a session's steps go one at
 * a time (409 while one is begun); a step that fails keeps no rows; the v2
 * parameters open and step sessions, and refuse both at once.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/attn.h"
#include "../server/base/clock.h"
#include "../server/batch/admit.h"
#include "../server/batch/pipeline.h"
#include "../server/body/request.h"
#include "../server/body/v2.h"
#include "check_run.h"
#include "test_models.h"

enum { E = 8 };

static attnd_models *models;
static attnd_version *ver; /* model "m", held: what every request here computes on */
static attnd_parse_env env;
static attnd_sessions *table;
static attn_ctx *ctx;
static attnd_pipeline *pipe_;

static unsigned seed = 11;
static float rnd(void) {
    seed = seed * 1103515245u + 12345u;
    return (float)(seed >> 8) / 16777216.0f - 0.5f;
}

/* A decoder layer: 2 query heads over 1 key/value head of width 4, its
 * weights drawn here, written to a safetensors file and loaded as the
 * daemon loads a model. */
static void setup(void) {
    attn_hparams hp = {.embed_dim = E,
                       .num_heads = 2,
                       .kdim = E,
                       .vdim = E,
                       .bias = 1,
                       .num_kv_heads = 1,
                       .head_dim = 4};
    attn_model drawn;
    char err[512], path[64];
    ck_assert_msg(attn_model_init(&drawn, &hp, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < drawn.n_floats; i++)
        drawn.mem[i] = rnd();
    ck_assert_msg(test_weights_temp(&drawn, path, sizeof path, err, sizeof err) == 0, "%s", err);
    attnd_model_config mc = test_model_entry("m", &hp, path);
    models = attnd_models_new(0);
    ck_assert(models != NULL);
    ver = test_models_add(models, &mc, err, sizeof err);
    unlink(path);
    ck_assert_msg(ver != NULL, "%s", err);
    ck_assert(memcmp(ver->model.mem, drawn.mem, drawn.n_floats * sizeof(float)) == 0);
    attn_model_free(&drawn);
    env = (attnd_parse_env){
        .models = models, .max_tokens_per_request = 4096, .max_attention_floats = 1 << 20};
    attnd_session_limits lim = {8, 1 << 20, 1 << 20, 60};
    table = attnd_sessions_new(&lim);
    ctx = attn_ctx_new(2);
    pipe_ = attnd_pipeline_new(ctx, 8);
    ck_assert(table && ctx && pipe_);
    attnd_sessions_hooks(table, test_version_hold, test_version_drop);
}

static void teardown(void) {
    attnd_pipeline_free(pipe_);
    attn_ctx_free(ctx);
    attnd_sessions_free(table); /* its sessions let their version go */
    attnd_version_unref(ver);
    attnd_models_free(models);
}

typedef struct {
    attnd_req r;
    int answered;
} treq;

static void treq_free(attnd_req *r) {
    attnd_req_clear(r);
    free(r);
}

static treq *treq_new(void) {
    treq *t = calloc(1, sizeof *t);
    attnd_req_init(&t->r, treq_free);
    t->r.deadline_us = UINT64_MAX;
    return t;
}

static void on_answered(void *arg, attnd_req *r) {
    (void)arg;
    ((treq *)r)->answered++;
}

/* {"query": rows}, the rows' numbers as JSON, with more fields after. */
static char *body_of(const float *x, int rows, const char *more) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"query\":[");
    for (int i = 0; i < rows; i++) {
        attnd_sb_puts(&b, i ? ",[" : "[");
        for (int c = 0; c < E; c++)
            attnd_sb_printf(&b, "%s%.9g", c ? "," : "", (double)x[i * E + c]);
        attnd_sb_putc(&b, ']');
    }
    attnd_sb_printf(&b, "]%s}", more);
    return attnd_sb_take(&b, NULL);
}

static float *rows_of(int n) {
    float *x = malloc(sizeof(float) * (size_t)n * E);
    for (int i = 0; i < n * E; i++)
        x[i] = rnd();
    return x;
}

/* Admits t, whose job is parsed: attnd_admit's return. */
static int admit(treq *t, const char *x_session_id, attnd_error *e) {
    attnd_admit_env a = {table, &env};
    int retry = 0;
    memset(e, 0, sizeof *e);
    return attnd_admit(&a, &t->r, x_session_id, attnd_mono_s(), e, &retry);
}

/* The answer's body as JSON; the caller decrefs. */
static json_t *answer_json(const treq *t) {
    json_error_t je;
    json_t *j = json_loads(t->r.reply.body, 0, &je);
    ck_assert_msg(j != NULL, "answer is not JSON: %s", je.text);
    return j;
}

/* Largest difference between the answer's output rows and want (rows x E). */
static double output_diff(const treq *t, const float *want, int rows) {
    json_t *j = answer_json(t), *out = json_object_get(j, "output");
    ck_assert_uint_eq(json_array_size(out), (size_t)rows);
    double worst = 0;
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < E; c++) {
            double v = json_number_value(json_array_get(json_array_get(out, (size_t)i), (size_t)c));
            worst = fmax(worst, fabs(v - want[i * E + c]));
        }
    json_decref(j);
    return worst;
}

/* The naive reference: rows of x (n x E) as one causal self-attention
 * sequence. */
static float *reference(const float *x, int n) {
    float *out = calloc((size_t)n * E, sizeof(float));
    attn_seq seq = {.L = n, .S = n, .causal = 1};
    attn_batch b = {1, &seq, x, NULL, NULL, out};
    char err[256];
    ck_assert_msg(attn_forward_ref(&ver->model, &b, err, sizeof err) == 0, "%s", err);
    return out;
}

/* Opens a session with a prefix of n rows of x through the pipeline; its
 * id into id. */
static void open_prefix(const float *x, int n, char id[ATTND_SESSION_ID_LEN + 1]) {
    treq *t = treq_new();
    attnd_error e;
    char *body = body_of(x, n, "");
    ck_assert_int_eq(attnd_parse_session_open(&env, body, strlen(body), &t->r.job, &e), 1);
    ck_assert_int_eq(admit(t, NULL, &e), 0);
    attnd_req *rs[1] = {&t->r};
    attnd_pipeline_run(pipe_, &ver->model, &ver->info, NULL, rs, 1, on_answered, NULL);
    ck_assert_int_eq(t->answered, 1);
    ck_assert_int_eq(t->r.reply.kind, AOK_CREATED); /* a native open: 201 */
    memcpy(id, t->r.step.id, ATTND_SESSION_ID_LEN + 1);
    free(body);
    attnd_req_unref(&t->r);
}

static attnd_session_stats stats(void) {
    attnd_session_stats s;
    attnd_sessions_stats(table, &s);
    return s;
}

START_TEST(test_step_and_sequence_share_a_batch) {
    setup();
    float *p = rows_of(5), *w = rows_of(4); /* p: a 3-row prefix, then a 2-row step */
    char id[ATTND_SESSION_ID_LEN + 1];
    open_prefix(p, 3, id);
    ck_assert_int_eq(stats().tokens, 3);
    treq *step = treq_new(), *whole = treq_new();
    attnd_error e;
    char *sb = body_of(p + 3 * E, 2, ""), *wb = body_of(w, 4, ",\"causal\":true");
    ck_assert_int_eq(attnd_parse_session_step(&env, ver, id, sb, strlen(sb), &step->r.job, &e), 0);
    ck_assert_int_eq(attnd_parse_native(&env, NULL, wb, strlen(wb), &whole->r.job, &e), 0);
    ck_assert_int_eq(admit(step, NULL, &e), 0);
    ck_assert_int_eq(admit(whole, NULL, &e), 0);
    ck_assert_int_eq(step->r.job.S, 5); /* causal over the 3 cached rows and its own 2 */
    ck_assert_int_eq(step->r.tokens, 2);
    ck_assert_int_eq(whole->r.tokens, 8);
    attnd_req *rs[2] = {&step->r, &whole->r};
    attnd_pipeline_run(pipe_, &ver->model, &ver->info, NULL, rs, 2, on_answered, NULL);
    ck_assert_int_eq(step->answered + whole->answered, 2);
    ck_assert_int_eq(step->r.reply.kind, AOK);
    ck_assert_int_eq(whole->r.reply.kind, AOK);
    ck_assert_int_eq(step->r.batch_requests, 2);
    float *ref_p = reference(p, 5), *ref_w = reference(w, 4);
    double dp = output_diff(step, ref_p + 3 * E, 2), dw = output_diff(whole, ref_w, 4);
    ck_assert_msg(dp < 1e-5, "the step's rows differ from the whole sequence's by %g", dp);
    ck_assert_msg(dw < 1e-5, "the sequence differs from its reference by %g", dw);
    json_t *j = answer_json(step);
    ck_assert_str_eq(json_string_value(json_object_get(j, "session")), id);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "cached_tokens")), 5);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "usage"), "batch")), 2);
    json_decref(j);
    ck_assert_int_eq(stats().tokens, 5); /* the step's rows kept */
    attnd_req_unref(&step->r);
    attnd_req_unref(&whole->r);
    free(ref_p);
    free(ref_w);
    free(sb);
    free(wb);
    free(p);
    free(w);
    teardown();
}
END_TEST

/* A step begun holds its session: the next is refused 409 until it ends;
 * a step dropped (never computed, or failed) keeps no rows. */
START_TEST(test_steps_one_at_a_time_and_failures_keep_nothing) {
    setup();
    treq *open = treq_new(), *a = treq_new(), *b = treq_new(), *big = treq_new();
    attnd_error e;
    ck_assert_int_eq(attnd_parse_session_open(&env, "{}", 2, &open->r.job, &e), 0);
    ck_assert_int_eq(admit(open, NULL, &e), 1); /* no prefix: answered at once */
    ck_assert_int_eq(open->r.reply.kind, AOK_CREATED);
    ck_assert_ptr_nonnull(strstr(open->r.reply.body, "\"cached_tokens\":0"));
    const char *id = open->r.step.id;
    float *x = rows_of(1);
    char *body = body_of(x, 1, "");
    ck_assert_int_eq(attnd_parse_session_step(&env, ver, id, body, strlen(body), &a->r.job, &e), 0);
    ck_assert_int_eq(attnd_parse_session_step(&env, ver, id, body, strlen(body), &b->r.job, &e), 0);
    ck_assert_int_eq(admit(a, NULL, &e), 0);
    ck_assert_int_eq(admit(b, NULL, &e), -1);
    ck_assert_int_eq(e.code, AERR_CONFLICT);
    attnd_req_unref(&a->r); /* never computed: its step dropped */
    ck_assert_int_eq(stats().tokens, 0);
    ck_assert_int_eq(admit(b, NULL, &e), 0); /* free again */
    /* rows whose projections overflow float32: 400, and the rows are dropped */
    for (int c = 0; c < E; c++)
        x[c] = 3e38f;
    char *huge = body_of(x, 1, "");
    attnd_req *rs[1] = {&b->r};
    attnd_pipeline_run(pipe_, &ver->model, &ver->info, NULL, rs, 1, on_answered, NULL);
    ck_assert_int_eq(b->r.reply.kind, AOK);
    ck_assert_int_eq(stats().tokens, 1);
    ck_assert_int_eq(attnd_parse_session_step(&env, ver, id, huge, strlen(huge), &big->r.job, &e),
                     0);
    ck_assert_int_eq(admit(big, NULL, &e), 0);
    rs[0] = &big->r;
    attnd_pipeline_run(pipe_, &ver->model, &ver->info, NULL, rs, 1, on_answered, NULL);
    ck_assert_int_eq(big->r.reply.kind, AERR_BAD_REQUEST);
    ck_assert_ptr_nonnull(strstr(big->r.reply.body, "overflows float32"));
    ck_assert_int_eq(stats().tokens, 1);
    attnd_req_unref(&open->r);
    attnd_req_unref(&b->r);
    attnd_req_unref(&big->r);
    free(x);
    free(body);
    free(huge);
    teardown();
}
END_TEST

/* A v2 body of one row with these parameters. */
static char *v2_body(const float *x, const char *params) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"inputs\":[{\"name\":\"query\",\"shape\":[1,1,8],\"datatype\":\"FP32\","
                      "\"data\":[");
    for (int c = 0; c < E; c++)
        attnd_sb_printf(&b, "%s%.9g", c ? "," : "", (double)x[c]);
    attnd_sb_printf(&b, "]}],\"parameters\":%s}", params);
    return attnd_sb_take(&b, NULL);
}

static treq *v2_parsed(const float *x, const char *params) {
    treq *t = treq_new();
    attnd_error e;
    char *body = v2_body(x, params);
    ck_assert_msg(attnd_parse_v2(&env, "m", body, strlen(body), 0, &t->r.job, &e) == 0, "%s",
                  e.msg);
    free(body);
    return t;
}

/* The v2 session dispatch, X-Session-Id a plain string: an open takes it
 * as its id, a step names its session in the parameters, both at once and
 * an unknown session are refused. */
START_TEST(test_v2_session_dispatch) {
    setup();
    static const char want[] = "0123456789abcdef0123456789abcdef";
    float *x = rows_of(1);
    attnd_error e;
    treq *both = v2_parsed(x, "{\"session_open\":true,\"session_id\":\"abc\"}");
    ck_assert_int_eq(admit(both, want, &e), -1);
    ck_assert_int_eq(e.code, AERR_BAD_REQUEST);
    ck_assert_ptr_nonnull(strstr(e.msg, "not both"));
    treq *bad_id = v2_parsed(x, "{\"session_open\":true}");
    ck_assert_int_eq(admit(bad_id, "not-an-id", &e), -1);
    ck_assert_int_eq(e.code, AERR_BAD_REQUEST);
    treq *open = v2_parsed(x, "{\"session_open\":true}");
    ck_assert_int_eq(admit(open, want, &e), 0);
    ck_assert_str_eq(open->r.step.id, want);
    attnd_req *rs[1] = {&open->r};
    attnd_pipeline_run(pipe_, &ver->model, &ver->info, NULL, rs, 1, on_answered, NULL);
    ck_assert_int_eq(open->r.reply.kind, AOK); /* v2 answers 200 */
    json_t *j = answer_json(open);
    json_t *par = json_object_get(j, "parameters");
    ck_assert_str_eq(json_string_value(json_object_get(par, "session_id")), want);
    ck_assert_int_eq(json_integer_value(json_object_get(par, "cached_tokens")), 1);
    json_decref(j);
    treq *step = v2_parsed(x, "{\"session_id\":\"0123456789abcdef0123456789abcdef\"}");
    ck_assert_int_eq(admit(step, "ffffffffffffffffffffffffffffffff", &e), 0); /* header unread */
    ck_assert_str_eq(step->r.step.id, want);
    ck_assert_int_eq(step->r.job.S, 2);
    treq *gone = v2_parsed(x, "{\"session_id\":\"ffffffffffffffffffffffffffffffff\"}");
    ck_assert_int_eq(admit(gone, NULL, &e), -1);
    ck_assert_int_eq(e.code, AERR_NOT_FOUND);
    treq *all[] = {both, bad_id, open, step, gone};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attnd_req_unref(&all[i]->r);
    ck_assert_int_eq(stats().sessions, 1);
    ck_assert_int_eq(stats().tokens, 1); /* the step never ran: dropped */
    free(x);
    teardown();
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_pipeline");
    TCase *tc = tcase_create("pipeline");
    tcase_add_test(tc, test_step_and_sequence_share_a_batch);
    tcase_add_test(tc, test_steps_one_at_a_time_and_failures_keep_nothing);
    tcase_add_test(tc, test_v2_session_dispatch);
    suite_add_tcase(s, tc);
    return check_run(s);
}
