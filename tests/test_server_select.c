/* test_server_select.c - the attention selection of a request, from its
 * body to its answer's bytes (server/body/selection.c, answer.c,
 * codec/half.c):
 *
 *   parse     every field read (native arrays, v2 strings and numbers,
 *             session steps' bodies) into attnd_job.sel, and the answer's
 *             size that limits.max_attention_floats counts;
 *   refusals  every bad selection refused with a 400 (413 past 2^53) that
 *             names the field and the value: heads empty, out of range or
 *             twice, rows reversed, empty, past L or not two numbers, top-k
 *             of 0 or past S (a step's at admission, against its cache),
 *             unknown dtypes, any of them while no attention is asked for,
 *             v2 outputs that do not go with top-k; a selection over the
 *             limit is 413, and one that fits is not, whatever L and S;
 *   rounding  float32 to float16 and bfloat16 to nearest, ties to even,
 *             for every float16 and at every tie, subnormals, overflow;
 *   writers   the answer's bytes: float16 and bfloat16 as their bits in
 *             base64 and binary and as the rounded numbers in JSON, top-k
 *             as {"indices", "values"} (v2: two outputs, INT32 and the
 *             datatype asked), in the order the core gave them.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/safetensors.h"
#include "../server/base/clock.h"
#include "../server/batch/admit.h"
#include "../server/body/answer.h"
#include "../server/body/request.h"
#include "../server/body/v2.h"
#include "../server/codec/base64.h"
#include "../server/codec/half.h"
#include "check_run.h"
#include "test_models.h"

/* Model "m": H = 4 heads of width 1, loaded as the daemon loads it
 * (embedded default weights); limits: 64 tokens, 200 attention floats. */
static const attn_hparams HP = {.embed_dim = 4, .num_heads = 4, .kdim = 4, .vdim = 4, .bias = 1};
static attnd_models *g_models;
static attnd_version *g_m; /* "m", held */
static attnd_parse_env ENV = {NULL, 64, 200};

static void models_new(void) {
    char err[512];
    ck_assert((g_models = attnd_models_new(0)) != NULL);
    attnd_model_config mc = test_model_entry("m", &HP, NULL);
    ck_assert_msg((g_m = test_models_add(g_models, &mc, err, sizeof err)) != NULL, "%s", err);
    ck_assert_int_eq(g_m->info.hp.num_kv_heads, 4);
    ck_assert_int_eq(g_m->info.hp.head_dim, 1);
    ENV.models = g_models;
}

static void models_free(void) {
    attnd_version_unref(g_m);
    attnd_models_free(g_models);
    g_m = NULL;
    g_models = NULL;
}

/* {"query": L rows of 4, ...more} */
static char *native_body(int L, const char *more) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"query\": [");
    for (int i = 0; i < L; i++)
        attnd_sb_printf(&b, "%s[%d, 0.5, -1, 2]", i ? ", " : "", i);
    attnd_sb_printf(&b, "]%s%s}", *more ? ", " : "", more);
    return attnd_sb_take(&b, NULL);
}

/* A v2 body of L query rows with the given parameters (and outputs). */
static char *v2_body(int L, const char *params, const char *outputs) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_printf(&b,
                    "{\"inputs\": [{\"name\": \"query\", \"shape\": [1, %d, 4], "
                    "\"datatype\": \"FP32\", \"data\": [",
                    L);
    for (int i = 0; i < 4 * L; i++)
        attnd_sb_printf(&b, "%s%d", i ? ", " : "", i % 7);
    attnd_sb_printf(&b, "]}], \"parameters\": {%s}%s%s}", params, *outputs ? ", " : "", outputs);
    return attnd_sb_take(&b, NULL);
}

static int parse_native(int L, const char *more, attnd_job *job, attnd_error *e) {
    char *body = native_body(L, more);
    memset(e, 0, sizeof *e);
    int rc = attnd_parse_native(&ENV, NULL, body, strlen(body), job, e);
    free(body);
    return rc;
}

static int parse_v2(int L, const char *params, const char *outputs, attnd_job *job,
                    attnd_error *e) {
    char *body = v2_body(L, params, outputs);
    memset(e, 0, sizeof *e);
    int rc = attnd_parse_v2(&ENV, "m", body, strlen(body), 0, job, e);
    free(body);
    return rc;
}

/* The parse must fail with code and a message holding w1 and w2. */
static void check_refusal(int rc, attnd_job *job, const attnd_error *e, attnd_kind code,
                          const char *what, const char *w1, const char *w2) {
    ck_assert_msg(rc < 0, "%s was accepted", what);
    ck_assert_msg(e->code == code, "%s: code %d, wanted %d (%s)", what, e->code, code, e->msg);
    ck_assert_msg(strstr(e->msg, w1), "%s: '%s' does not hold '%s'", what, e->msg, w1);
    if (w2) ck_assert_msg(strstr(e->msg, w2), "%s: '%s' does not hold '%s'", what, e->msg, w2);
    ck_assert_ptr_null(job->query);
    ck_assert_ptr_null(job->sel.heads);
}

static void native_refused(int L, const char *more, attnd_kind code, const char *w1,
                           const char *w2) {
    attnd_job job;
    attnd_error e;
    check_refusal(parse_native(L, more, &job, &e), &job, &e, code, more, w1, w2);
}

static void v2_refused(int L, const char *params, const char *outputs, const char *w1,
                       const char *w2) {
    attnd_job job;
    attnd_error e;
    check_refusal(parse_v2(L, params, outputs, &job, &e), &job, &e, AERR_BAD_REQUEST, params, w1,
                  w2);
}

/* ---- parse ---- */

START_TEST(test_native_fields) {
    attnd_job job;
    attnd_error e;
    ck_assert_int_eq(parse_native(6,
                                  "\"attention\": \"heads\", \"attention_heads\": [3, 1], "
                                  "\"attention_rows\": [2, 5], \"attention_top_k\": 4, "
                                  "\"attention_dtype\": \"float16\"",
                                  &job, &e),
                     0);
    ck_assert_int_eq(job.sel.n_heads, 2);
    ck_assert_int_eq(job.sel.heads[0], 3); /* as given */
    ck_assert_int_eq(job.sel.heads[1], 1);
    ck_assert_int_eq(job.sel.row0, 2);
    ck_assert_int_eq(job.sel.row1, 5);
    ck_assert_int_eq(job.sel.top_k, 4);
    ck_assert_int_eq(job.sel.dtype, ATTND_ELEM_F16);
    ck_assert_uint_eq(attnd_job_attention_floats(&job, 4), 2 * 3 * 4);
    attnd_job_free(&job);
    ck_assert_int_eq(
        parse_native(6, "\"attention\": \"mean\", \"attention_dtype\": \"bfloat16\"", &job, &e), 0);
    ck_assert_ptr_null(job.sel.heads);
    ck_assert_int_eq(job.sel.row1, 0);
    ck_assert_int_eq(job.sel.top_k, 0);
    ck_assert_int_eq(job.sel.dtype, ATTND_ELEM_BF16);
    ck_assert_uint_eq(attnd_job_attention_floats(&job, 4), 6 * 6);
    attnd_job_free(&job);
    /* a mean over some heads is one matrix; top-k of every key is whole rows' worth */
    ck_assert_int_eq(parse_native(6,
                                  "\"attention\": \"mean\", \"attention_heads\": [0], "
                                  "\"attention_top_k\": 6",
                                  &job, &e),
                     0);
    ck_assert_uint_eq(attnd_job_attention_floats(&job, 4), 6 * 6);
    attnd_job_free(&job);
}
END_TEST

START_TEST(test_v2_fields) {
    attnd_job job;
    attnd_error e;
    ck_assert_int_eq(parse_v2(6,
                              "\"attention\": \"heads\", \"attention_heads\": \" 2, 0 \", "
                              "\"attention_rows\": \"1:6\", \"attention_top_k\": 3, "
                              "\"attention_datatype\": \"BF16\"",
                              "", &job, &e),
                     0);
    ck_assert_int_eq(job.sel.n_heads, 2);
    ck_assert_int_eq(job.sel.heads[0], 2);
    ck_assert_int_eq(job.sel.heads[1], 0);
    ck_assert_int_eq(job.sel.row0, 1);
    ck_assert_int_eq(job.sel.row1, 6);
    ck_assert_int_eq(job.sel.top_k, 3);
    ck_assert_int_eq(job.sel.dtype, ATTND_ELEM_BF16);
    attnd_job_free(&job);
    /* one head as a number; an attention output listed asks for the mean */
    ck_assert_int_eq(parse_v2(3, "\"attention_heads\": 3, \"attention_datatype\": \"FP16\"",
                              "\"outputs\": [{\"name\": \"attention\"}]", &job, &e),
                     0);
    ck_assert_int_eq(job.weights, ATTN_WEIGHTS_MEAN);
    ck_assert_int_eq(job.sel.n_heads, 1);
    ck_assert_int_eq(job.sel.heads[0], 3);
    ck_assert_int_eq(job.v2_outputs, V2_OUT_ATTENTION);
    attnd_job_free(&job);
    /* top-k's outputs, one of them in binary */
    ck_assert_int_eq(parse_v2(3, "\"attention_top_k\": 1",
                              "\"outputs\": [{\"name\": \"attention_topk_values\", "
                              "\"parameters\": {\"binary_data\": true}}, "
                              "{\"name\": \"attention_topk_indices\"}]",
                              &job, &e),
                     0);
    ck_assert_int_eq(job.weights, ATTN_WEIGHTS_MEAN);
    ck_assert_int_eq(job.v2_outputs, V2_OUT_TOPK_INDICES | V2_OUT_TOPK_VALUES);
    ck_assert_int_eq(job.v2_binary, V2_OUT_TOPK_VALUES);
    attnd_job_free(&job);
}
END_TEST

/* ---- refusals ---- */

START_TEST(test_native_refusals) {
    const char *H = "\"attention\": \"heads\", ";
    char b[256];
#define R(more, code, w1, w2)                                                                      \
    do {                                                                                           \
        snprintf(b, sizeof b, "%s%s", H, more);                                                    \
        native_refused(6, b, code, w1, w2);                                                        \
    } while (0)
    R("\"attention_heads\": [1, 4]", AERR_BAD_REQUEST, "attention_heads[1]: head 4",
      "model 'm' has 4 heads (0 to 3)");
    R("\"attention_heads\": [2, 0, 2]", AERR_BAD_REQUEST, "attention_heads[2]: head 2",
      "given twice");
    R("\"attention_heads\": []", AERR_BAD_REQUEST, "attention_heads: empty", NULL);
    R("\"attention_heads\": [-1]", AERR_BAD_REQUEST, "attention_heads[0]", "-1");
    R("\"attention_heads\": [0.5]", AERR_BAD_REQUEST, "attention_heads[0]", "0.5");
    R("\"attention_heads\": [\"1\"]", AERR_BAD_REQUEST, "attention_heads[0]", "a string");
    R("\"attention_heads\": \"0,1\"", AERR_BAD_REQUEST, "attention_heads", "array");
    R("\"attention_heads\": [1e17]", AERR_BAD_REQUEST, "attention_heads[0]", "too large");
    R("\"attention_heads\": [9007199254740992]", AERR_BAD_REQUEST, "head 9007199254740992",
      "out of range");
    R("\"attention_rows\": [4, 2]", AERR_BAD_REQUEST, "attention_rows: [4, 2] is reversed", NULL);
    R("\"attention_rows\": [3, 3]", AERR_BAD_REQUEST, "attention_rows: [3, 3] is empty", NULL);
    R("\"attention_rows\": [0, 7]", AERR_BAD_REQUEST, "attention_rows: [0, 7] is out of range",
      "6 rows");
    R("\"attention_rows\": [1]", AERR_BAD_REQUEST, "attention_rows", "got one");
    R("\"attention_rows\": [1, 2, 3]", AERR_BAD_REQUEST, "attention_rows", "more than two");
    R("\"attention_rows\": []", AERR_BAD_REQUEST, "attention_rows", "got none");
    R("\"attention_rows\": [0, -2]", AERR_BAD_REQUEST, "attention_rows[1]", "-2");
    R("\"attention_top_k\": 0", AERR_BAD_REQUEST, "attention_top_k: 0", "at least 1");
    R("\"attention_top_k\": 7", AERR_BAD_REQUEST, "attention_top_k: 7 is more than the 6 keys",
      NULL);
    R("\"attention_top_k\": 1.5", AERR_BAD_REQUEST, "attention_top_k", "1.5");
    R("\"attention_dtype\": \"float64\"", AERR_BAD_REQUEST, "attention_dtype",
      "\"float16\", \"bfloat16\", got \"float64\"");
    R("\"attention_dtype\": \"FP16\"", AERR_BAD_REQUEST, "attention_dtype", "got \"FP16\"");
#undef R
    /* a selection needs attention: none or absent, each field named */
    const char *fields[] = {"\"attention_heads\": [0]", "\"attention_rows\": [0, 1]",
                            "\"attention_top_k\": 1", "\"attention_dtype\": \"float16\""};
    const char *names[] = {"attention_heads", "attention_rows", "attention_top_k",
                           "attention_dtype"};
    for (int i = 0; i < 4; i++) {
        native_refused(6, fields[i], AERR_BAD_REQUEST, names[i], "no attention is asked for");
        snprintf(b, sizeof b, "\"attention\": \"none\", %s", fields[i]);
        native_refused(6, b, AERR_BAD_REQUEST, names[i], "no attention is asked for");
    }
}
END_TEST

START_TEST(test_v2_refusals) {
    const char *M = "\"attention\": \"mean\", ";
    char b[256];
#define R(more, w1, w2)                                                                            \
    do {                                                                                           \
        snprintf(b, sizeof b, "%s%s", M, more);                                                    \
        v2_refused(6, b, "", w1, w2);                                                              \
    } while (0)
    R("\"attention_heads\": \"1,x\"", "parameters.attention_heads: \"1,x\"", "not a list");
    R("\"attention_heads\": \"1,,2\"", "parameters.attention_heads", "not a list");
    R("\"attention_heads\": \"1,\"", "parameters.attention_heads", "not a list");
    R("\"attention_heads\": \"-1\"", "parameters.attention_heads", "not a list");
    R("\"attention_heads\": \"12345678901\"", "parameters.attention_heads", "not a list");
    R("\"attention_heads\": \"\"", "parameters.attention_heads: empty", NULL);
    R("\"attention_heads\": \"0,4\"", "parameters.attention_heads: head 4 is out of range", NULL);
    R("\"attention_heads\": \"1,1\"", "parameters.attention_heads: head 1 is given twice", NULL);
    R("\"attention_heads\": [1]", "parameters.attention_heads", "a string");
    R("\"attention_rows\": \"2-4\"", "parameters.attention_rows: \"2-4\" is not \"start:end\"",
      NULL);
    R("\"attention_rows\": \"2:\"", "parameters.attention_rows", "not \"start:end\"");
    R("\"attention_rows\": \"2:4:6\"", "parameters.attention_rows", "not \"start:end\"");
    R("\"attention_rows\": 3", "parameters.attention_rows", "a string");
    R("\"attention_rows\": \"4:2\"", "parameters.attention_rows: \"4:2\" is reversed", NULL);
    R("\"attention_rows\": \"2:2\"", "parameters.attention_rows: \"2:2\" is empty", NULL);
    R("\"attention_rows\": \"0:9\"", "parameters.attention_rows: \"0:9\" is out of range", NULL);
    R("\"attention_top_k\": 0", "parameters.attention_top_k: 0", "at least 1");
    R("\"attention_top_k\": 9", "parameters.attention_top_k: 9 is more than the 6 keys", NULL);
    R("\"attention_top_k\": \"3\"", "parameters.attention_top_k", "a size");
    R("\"attention_datatype\": \"float16\"", "parameters.attention_datatype",
      "\"FP16\", \"BF16\", got \"float16\"");
#undef R
    v2_refused(6, "\"attention_heads\": \"0\"", "", "parameters.attention_heads",
               "no attention is asked for");
    v2_refused(6, "\"attention\": \"mean\", \"attention_rows\": \"0:1\"",
               "\"outputs\": [{\"name\": \"output\"}]", "parameters.attention_rows",
               "no attention is asked for");
    v2_refused(6, "\"attention_top_k\": 2", "\"outputs\": [{\"name\": \"attention\"}]",
               "outputs: 'attention' is asked for", "attention_topk_indices");
    v2_refused(6, "\"attention\": \"mean\"", "\"outputs\": [{\"name\": \"attention_topk_values\"}]",
               "outputs: 'attention_topk_values'", "needs parameters.attention_top_k");
    v2_refused(6, "\"attention\": \"none\", \"attention_top_k\": 2",
               "\"outputs\": [{\"name\": \"attention_topk_indices\"}]",
               "outputs: 'attention_topk_indices' is asked for", "\"none\"");
    v2_refused(6, "", "\"outputs\": [{\"name\": \"attention_topk\"}]", "unknown output",
               "attention_topk_indices, attention_topk_values");
}
END_TEST

/* max_attention_floats (200 here) counts what the answer holds: a request
 * whose whole matrices are over it is served when its selection fits. */
START_TEST(test_limit_counts_the_selection) {
    attnd_job job;
    attnd_error e;
    native_refused(16, "\"attention\": \"heads\"", AERR_TOO_LARGE, "1024 floats", "limit is 200");
    ck_assert_int_eq(parse_native(16,
                                  "\"attention\": \"heads\", \"attention_heads\": [1, 2], "
                                  "\"attention_rows\": [0, 6]",
                                  &job, &e),
                     0);
    ck_assert_uint_eq(attnd_job_attention_floats(&job, 4), 2 * 6 * 16);
    attnd_job_free(&job);
    ck_assert_int_eq(parse_native(16, "\"attention\": \"heads\", \"attention_top_k\": 3", &job, &e),
                     0);
    ck_assert_uint_eq(attnd_job_attention_floats(&job, 4), 4 * 16 * 3);
    attnd_job_free(&job);
    native_refused(16, "\"attention\": \"heads\", \"attention_top_k\": 4", AERR_TOO_LARGE,
                   "256 floats", "select heads, rows or top-k");
    native_refused(16, "\"attention\": \"mean\", \"attention_rows\": [2, 15]", AERR_TOO_LARGE,
                   "208 floats", NULL);
}
END_TEST

/* A session step's selection: top-k against the cache at admission, rows
 * against the step's own rows. */
START_TEST(test_session_steps) {
    attnd_session_limits lim = {4, 1 << 20, 1 << 20, 60};
    attnd_sessions *table = attnd_sessions_new(&lim);
    attnd_sessions_hooks(table, test_version_hold, test_version_drop);
    attnd_admit_env a = {table, &ENV};
    attnd_req r;
    attnd_error e;
    int retry;
    char id[ATTND_SESSION_ID_LEN + 1];
    attnd_req_init(&r, NULL);
    char *body = native_body(5, ""); /* the prefix: 5 tokens */
    ck_assert_int_eq(attnd_parse_session_open(&ENV, body, strlen(body), &r.job, &e), 1);
    free(body);
    ck_assert_msg(attnd_admit(&a, &r, NULL, attnd_mono_s(), &e, &retry) == 0, "%s", e.msg);
    snprintf(id, sizeof id, "%s", r.step.id);
    attnd_req_end_step(&r, 1);
    attnd_job_free(&r.job);
    struct {
        const char *more;
        int parsed, admitted;
        const char *says;
    } steps[] = {
        {"\"attention\": \"mean\", \"attention_top_k\": 7", 1, 1, NULL},
        {"\"attention\": \"mean\", \"attention_top_k\": 8", 1, 0,
         "attention_top_k: 8 is more than the 7 keys"},
        {"\"attention\": \"heads\", \"attention_rows\": [1, 2], \"attention_heads\": [3]", 1, 1,
         NULL},
        {"\"attention\": \"heads\", \"attention_rows\": [1, 3]", 0, 0,
         "attention_rows: [1, 3] is out of range: the query has 2 rows"},
        {"\"attention\": \"heads\", \"attention_top_k\": 3000000000", 0, 0,
         "attention_top_k: 3000000000 is more than"},
        {"\"attention_heads\": [0]", 0, 0, "no attention is asked for"},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        body = native_body(2, steps[i].more);
        memset(&e, 0, sizeof e);
        int rc = attnd_parse_session_step(&ENV, g_m, id, body, strlen(body), &r.job, &e);
        free(body);
        ck_assert_msg((rc == 0) == steps[i].parsed, "step %zu: parse %d (%s)", i, rc, e.msg);
        if (rc == 0) {
            rc = attnd_admit(&a, &r, NULL, attnd_mono_s(), &e, &retry);
            ck_assert_msg((rc == 0) == steps[i].admitted, "step %zu: admit %d (%s)", i, rc, e.msg);
            if (rc == 0) ck_assert_int_eq(r.job.S, 7);
            attnd_req_end_step(&r, 0); /* not computed: the session stays at 5 tokens */
            attnd_job_free(&r.job);
        }
        if (steps[i].says)
            ck_assert_msg(strstr(e.msg, steps[i].says), "step %zu: '%s' lacks '%s'", i, e.msg,
                          steps[i].says);
    }
    /* an open without a prefix takes "model" alone */
    const char *open = "{\"attention_top_k\": 1}";
    ck_assert_int_eq(attnd_parse_session_open(&ENV, open, strlen(open), &r.job, &e), -1);
    ck_assert_msg(strstr(e.msg, "attention_top_k: a session opened without a prefix"), "%s", e.msg);
    attnd_sessions_free(table);
}
END_TEST

/* ---- rounding ---- */

static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

START_TEST(test_float16_rounding) {
    for (uint32_t h = 0; h < 0x10000; h++) {                 /* every float16 back to itself */
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN */
        float x = st_f16_to_f32((uint16_t)h);
        ck_assert_msg(attnd_f16_of(x) == h, "%04x -> %g -> %04x", h, (double)x, attnd_f16_of(x));
    }
    /* halfway between two neighbours: to the even one; a hair above: up */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        double lo = st_f16_to_f32((uint16_t)h), hi = st_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact in float32 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        ck_assert_msg(attnd_f16_of(mid) == even, "tie above %04x -> %04x", h, attnd_f16_of(mid));
        ck_assert_msg(attnd_f16_of(-mid) == (even | 0x8000), "negative tie above %04x", h);
        ck_assert_int_eq(attnd_f16_of(nextafterf(mid, INFINITY)), h + 1);
        ck_assert_int_eq(attnd_f16_of(nextafterf(mid, 0)), h);
    }
    ck_assert_int_eq(attnd_f16_of(65519.99f), 0x7bff);
    ck_assert_int_eq(attnd_f16_of(65520.0f), 0x7c00); /* the tie past the largest: infinity */
    ck_assert_int_eq(attnd_f16_of(1e30f), 0x7c00);
    ck_assert_int_eq(attnd_f16_of(-INFINITY), 0xfc00);
    ck_assert_int_eq(attnd_f16_of(f32_of_bits(0x33000000)), 0); /* 2^-25: tie to 0 */
    ck_assert_int_eq(attnd_f16_of(f32_of_bits(0x33000001)), 1); /* above it: the least */
    ck_assert_int_eq(attnd_f16_of(f32_of_bits(0x00000001)), 0); /* a float32 subnormal */
    ck_assert_int_eq(attnd_f16_of(-0.0f), 0x8000);
    ck_assert((attnd_f16_of(NAN) & 0x7c00) == 0x7c00 && (attnd_f16_of(NAN) & 0x3ff));
    ck_assert_float_eq(attnd_elem_round(0.1f, ATTND_ELEM_F16), 0.0999755859375f);
}
END_TEST

START_TEST(test_bfloat16_rounding) {
    for (uint32_t b = 0; b < 0x10000; b++) {                /* every bfloat16 back to itself */
        if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) continue; /* NaN */
        float x = st_bf16_to_f32((uint16_t)b);
        ck_assert_int_eq(attnd_bf16_of_keep(x), b);
        if ((b & 0x7fff) >= 0x7f7f) continue;
        /* the float32 halfway to the next, and its neighbours */
        uint32_t mid = (b << 16) + 0x8000u;
        uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
        ck_assert_int_eq(attnd_bf16_of_keep(f32_of_bits(mid)), even);
        ck_assert_int_eq(attnd_bf16_of_keep(f32_of_bits(mid + 1)), b + 1);
        ck_assert_int_eq(attnd_bf16_of_keep(f32_of_bits(mid - 1)), b);
    }
    ck_assert_int_eq(attnd_bf16_of_keep(f32_of_bits(0x7f7fffff)), 0x7f80); /* past the largest */
    ck_assert((attnd_bf16_of_keep(NAN) & 0x7f80) == 0x7f80 && (attnd_bf16_of_keep(NAN) & 0x7f));
    ck_assert_float_eq(attnd_elem_round(0.1f, ATTND_ELEM_BF16), 0.10009765625f);
}
END_TEST

/* ---- writers ---- */

/* The plain writer's answer for job (its attn and attn_idx set). */
static char *answer_of(const attnd_job *job, const float *out, size_t *len, size_t *json_len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_usage u = {.batch_requests = 1};
    ck_assert_int_eq(attnd_write_answer(&b, job, &g_m->info, out, &u, json_len), 0);
    return attnd_sb_take(&b, len);
}

/* A job of L = 3 rows, S = 3 keys, mean top-2, answered from these. */
static float OUT[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static float VALS[6] = {0.6f, 0.1f, 0.5f, 0.5f, 1.0f, 0.0f};
static int32_t IDX[6] = {2, 0, 0, 1, 1, 0};

static attnd_job topk_job(attnd_api api, attnd_encoding enc, attnd_elem dtype) {
    attnd_job j = {.api = api, .enc = enc, .B = 1, .L = 3, .S = 3, .weights = ATTN_WEIGHTS_MEAN};
    j.sel.top_k = 2;
    j.sel.dtype = dtype;
    j.attn = VALS;
    j.attn_idx = IDX;
    return j;
}

START_TEST(test_native_topk_json) {
    attnd_job j = topk_job(API_NATIVE, ENC_JSON, ATTND_ELEM_F16);
    size_t len, jl;
    char *body = answer_of(&j, OUT, &len, &jl);
    /* the rounded values as numbers: 0.6 -> 0.60009765625, 0.1 -> 0.0999755859375 */
    const char *want = ",\"attention\":{\"indices\":[[2,0],[0,1],[1,0]],\"values\":"
                       "[[0.600097656,0.0999755859],[0.5,0.5],[1,0]]},\"usage\"";
    ck_assert_msg(strstr(body, want) != NULL, "%s", body);
    free(body);
    j.sel.dtype = ATTND_ELEM_F32;
    body = answer_of(&j, OUT, &len, &jl);
    ck_assert_msg(strstr(body, "\"values\":[[0.600000024,0.100000001],") != NULL, "%s", body);
    free(body);
}
END_TEST

/* The bytes a base64 tensor object's "b64" holds in body, after key. */
static unsigned char *b64_after(const char *body, const char *key, size_t *n) {
    const char *at = strstr(body, key);
    ck_assert_msg(at != NULL, "no %s in %s", key, body);
    at = strstr(at, "\"b64\":\"") + 7;
    size_t chars = (size_t)(strchr(at, '"') - at);
    unsigned char *out = malloc(chars);
    ck_assert_int_eq(attnd_b64_decode(at, chars, out, chars, n, 0), 0);
    return out;
}

START_TEST(test_native_base64_dtypes) {
    for (int d = 0; d < 3; d++) {
        attnd_elem dt = d == 0 ? ATTND_ELEM_F32 : d == 1 ? ATTND_ELEM_F16 : ATTND_ELEM_BF16;
        attnd_job j = topk_job(API_NATIVE, ENC_BASE64, dt);
        size_t len, jl, n;
        char *body = answer_of(&j, OUT, &len, &jl);
        const char *dtype = d == 0 ? "float32" : d == 1 ? "float16" : "bfloat16";
        char want[96];
        snprintf(want, sizeof want, "\"values\":{\"shape\":[3,2],\"dtype\":\"%s\"", dtype);
        ck_assert_msg(strstr(body, want) != NULL, "%s", body);
        ck_assert_msg(strstr(body, "\"indices\":{\"shape\":[3,2],\"dtype\":\"int32\"") != NULL,
                      "%s", body);
        unsigned char *idx = b64_after(body, "\"indices\"", &n);
        ck_assert_uint_eq(n, sizeof IDX);
        ck_assert_int_eq(memcmp(idx, IDX, sizeof IDX), 0);
        unsigned char *v = b64_after(body, "\"values\"", &n);
        ck_assert_uint_eq(n, 6 * attnd_elem_size(dt));
        for (int k = 0; k < 6; k++) {
            uint16_t h = (uint16_t)(v[2 * k] | v[2 * k + 1] << 8);
            if (d == 0) ck_assert_int_eq(memcmp(v + 4 * k, &VALS[k], 4), 0);
            if (d == 1) ck_assert_int_eq(h, attnd_f16_of(VALS[k]));
            if (d == 2) ck_assert_int_eq(h, attnd_bf16_of_keep(VALS[k]));
        }
        free(idx);
        free(v);
        free(body);
    }
}
END_TEST

START_TEST(test_v2_topk_outputs) {
    attnd_job j = topk_job(API_V2, ENC_JSON, ATTND_ELEM_BF16);
    size_t len, jl;
    char *body = answer_of(&j, OUT, &len, &jl);
    ck_assert_uint_eq(jl, 0);
    const char *want = "{\"name\":\"attention_topk_indices\",\"datatype\":\"INT32\",\"shape\":"
                       "[1,1,3,2],\"data\":[2,0,0,1,1,0]},{\"name\":\"attention_topk_values\","
                       "\"datatype\":\"BF16\",\"shape\":[1,1,3,2],\"data\":[0.6015625,0.10009765"
                       "6,0.5,0.5,1,0]}]}";
    ck_assert_msg(strstr(body, want) != NULL, "%s", body);
    free(body);
    /* binary: the JSON says each size, the bytes follow in the outputs' order */
    j.sel.dtype = ATTND_ELEM_F16;
    j.v2_binary = V2_OUT_ALL;
    j.v2_outputs = V2_OUT_TOPK_INDICES | V2_OUT_TOPK_VALUES;
    body = answer_of(&j, OUT, &len, &jl);
    ck_assert_msg(strstr(body, "\"datatype\":\"INT32\",\"shape\":[1,1,3,2],\"parameters\":"
                               "{\"binary_data_size\":24}}") != NULL,
                  "%.*s", (int)jl, body);
    ck_assert_msg(strstr(body, "\"datatype\":\"FP16\",\"shape\":[1,1,3,2],\"parameters\":"
                               "{\"binary_data_size\":12}}") != NULL,
                  "%.*s", (int)jl, body);
    ck_assert_ptr_null(strstr(body, "\"name\":\"output\""));
    ck_assert_uint_eq(len, jl + 24 + 12);
    ck_assert_int_eq(memcmp(body + jl, IDX, 24), 0);
    for (int k = 0; k < 6; k++) {
        const unsigned char *p = (const unsigned char *)body + jl + 24 + 2 * k;
        ck_assert_int_eq(p[0] | p[1] << 8, attnd_f16_of(VALS[k]));
    }
    free(body);
}
END_TEST

START_TEST(test_selected_shapes) {
    float attn[2 * 2 * 3] = {0};
    int heads[2] = {3, 0};
    attnd_job j = {.api = API_NATIVE, .B = 1, .L = 3, .S = 3, .weights = ATTN_WEIGHTS_HEADS};
    j.sel = (attnd_attn_select){.heads = heads, .n_heads = 2, .row0 = 1, .row1 = 3};
    j.attn = attn;
    j.enc = ENC_BASE64;
    size_t len, jl;
    char *body = answer_of(&j, OUT, &len, &jl);
    ck_assert_msg(strstr(body, "\"attention\":{\"shape\":[2,2,3],\"dtype\":\"float32\"") != NULL,
                  "%s", body);
    free(body);
    j.api = API_V2;
    body = answer_of(&j, OUT, &len, &jl);
    ck_assert_msg(strstr(body, "{\"name\":\"attention\",\"datatype\":\"FP32\",\"shape\":[1,2,2,3]"),
                  "%s", body);
    free(body);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_select");
    TCase *tp = tcase_create("parse");
    tcase_add_unchecked_fixture(tp, models_new, models_free);
    tcase_add_test(tp, test_native_fields);
    tcase_add_test(tp, test_v2_fields);
    tcase_add_test(tp, test_native_refusals);
    tcase_add_test(tp, test_v2_refusals);
    tcase_add_test(tp, test_limit_counts_the_selection);
    tcase_add_test(tp, test_session_steps);
    suite_add_tcase(s, tp);
    TCase *tw = tcase_create("writers");
    tcase_add_unchecked_fixture(tw, models_new, models_free);
    tcase_add_test(tw, test_float16_rounding);
    tcase_add_test(tw, test_bfloat16_rounding);
    tcase_add_test(tw, test_native_topk_json);
    tcase_add_test(tw, test_native_base64_dtypes);
    tcase_add_test(tw, test_v2_topk_outputs);
    tcase_add_test(tw, test_selected_shapes);
    suite_add_tcase(s, tw);
    return check_run(s);
}
