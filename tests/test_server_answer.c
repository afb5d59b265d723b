/* test_server_answer.c - the answer writers (server/body/answer.c): answers
 * written over the compute pool in chunks (attnd_write_answers) are, byte
 * for byte, those of the plain writer on one thread (attnd_write_answer),
 * for native and v2 answers, JSON, base64 and binary tensors, with and
 * without attention matrices, at sizes on and across the chunk boundaries
 * (rows cut by a chunk, rows longer than a chunk, tensors of exactly one
 * chunk), alone and many at once, on 1, 2 and 3 threads and on none; every
 * answer is handed back exactly once. Selections too: some rows and heads,
 * top-k's int32 indices and values, float16 and bfloat16 weights (JSON,
 * base64 and binary, across chunks). Session steps' fields are written in
 * place, where the session routes promise them.
 */
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/body/answer.h"
#include "check_run.h"

/* One answer to write: what the request asked and the model's widths. */
typedef struct {
    const char *what;
    attnd_api api;
    attnd_encoding enc;
    int B, L, S, E, H;
    int rank3;
    attn_weights_mode weights;
    int v2_binary, v2_outputs;
    const char *session; /* usage.session, or NULL */
    int top_k;           /* the selection: top-k, */
    attnd_elem dtype;    /* the weights' type, */
    int rows;            /* rows [1, 1 + rows) when > 0, */
    int heads;           /* heads H-1 .. H-heads when > 0 */
} acase;

#define TXT ANSWER_TEXT_CHUNK
static const acase CASES[] = {
    {"native, 2 rows", API_NATIVE, ENC_JSON, 1, 2, 2, 8, 2, 0, ATTN_WEIGHTS_NONE, 0, 0, NULL, 0,
     ATTND_ELEM_F32, 0, 0},
    {"native, exactly one chunk", API_NATIVE, ENC_JSON, 1, TXT / 32, TXT / 32, 32, 4, 0,
     ATTN_WEIGHTS_NONE, 0, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native, one row past a chunk", API_NATIVE, ENC_JSON, 1, TXT / 32 + 1, TXT / 32 + 1, 32, 4, 0,
     ATTN_WEIGHTS_NONE, 0, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native, chunks cut rows", API_NATIVE, ENC_JSON, 1, 683, 683, 24, 3, 0, ATTN_WEIGHTS_NONE, 0,
     0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native, rows longer than a chunk", API_NATIVE, ENC_JSON, 1, 3, 3, 20000, 4, 0,
     ATTN_WEIGHTS_NONE, 0, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native batch, heads", API_NATIVE, ENC_JSON, 3, 229, 229, 24, 3, 1, ATTN_WEIGHTS_HEADS, 0, 0,
     NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native, mean over 1-key rows", API_NATIVE, ENC_JSON, 1, 2 * TXT + 1, 1, 8, 2, 0,
     ATTN_WEIGHTS_MEAN, 0, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native base64, one past a chunk", API_NATIVE, ENC_BASE64, 1, 2049, 30, 24, 3, 0,
     ATTN_WEIGHTS_MEAN, 0, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native base64 batch, heads", API_NATIVE, ENC_BASE64, 2, 300, 300, 40, 5, 1,
     ATTN_WEIGHTS_HEADS, 0, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"native base64, exactly one chunk", API_NATIVE, ENC_BASE64, 1, ANSWER_B64_CHUNK / 24, 5, 24, 3,
     0, ATTN_WEIGHTS_NONE, 0, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"v2 JSON, heads", API_V2, ENC_JSON, 2, 400, 50, 24, 3, 0, ATTN_WEIGHTS_HEADS, 0, 0, NULL, 0,
     ATTND_ELEM_F32, 0, 0},
    {"v2 JSON, output only listed", API_V2, ENC_JSON, 1, 700, 700, 24, 3, 0, ATTN_WEIGHTS_MEAN, 0,
     1, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"v2 binary output, JSON attention", API_V2, ENC_JSON, 2, 5462, 8, 24, 3, 0, ATTN_WEIGHTS_MEAN,
     1, 0, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"v2 binary both", API_V2, ENC_JSON, 1, 3000, 200, 40, 4, 0, ATTN_WEIGHTS_HEADS, 3, 0, NULL, 0,
     ATTND_ELEM_F32, 0, 0},
    {"v2 binary attention only listed", API_V2, ENC_JSON, 1, 1000, 400, 16, 2, 0,
     ATTN_WEIGHTS_HEADS, 2, 2, NULL, 0, ATTND_ELEM_F32, 0, 0},
    {"session step, native", API_NATIVE, ENC_JSON, 1, 900, 1200, 24, 3, 0, ATTN_WEIGHTS_MEAN, 0, 0,
     "s-\"1\"", 0, ATTND_ELEM_F32, 0, 0},
    {"session step, native base64", API_NATIVE, ENC_BASE64, 1, 1, 5, 24, 3, 0, ATTN_WEIGHTS_NONE, 0,
     0, "abc", 0, ATTND_ELEM_F32, 0, 0},
    {"session step, v2 binary", API_V2, ENC_JSON, 1, 12000, 12000, 24, 3, 0, ATTN_WEIGHTS_NONE, 1,
     0, "abc", 0, ATTND_ELEM_F32, 0, 0},
    {"native top-k float16, chunks cut rows", API_NATIVE, ENC_JSON, 2, 700, 900, 8, 4, 1,
     ATTN_WEIGHTS_HEADS, 0, 0, NULL, 7, ATTND_ELEM_F16, 0, 0},
    {"native base64 top-k bfloat16, past a chunk", API_NATIVE, ENC_BASE64, 1, 3000, 64, 8, 2, 0,
     ATTN_WEIGHTS_MEAN, 0, 0, NULL, 37, ATTND_ELEM_BF16, 0, 0},
    {"native base64 float16 heads and rows", API_NATIVE, ENC_BASE64, 2, 400, 300, 8, 4, 1,
     ATTN_WEIGHTS_HEADS, 0, 0, NULL, 0, ATTND_ELEM_F16, 390, 3},
    {"native JSON bfloat16 rows", API_NATIVE, ENC_JSON, 1, 900, 100, 8, 4, 0, ATTN_WEIGHTS_MEAN, 0,
     0, NULL, 0, ATTND_ELEM_BF16, 500, 0},
    {"v2 binary top-k FP16", API_V2, ENC_JSON, 1, 2000, 200, 8, 4, 0, ATTN_WEIGHTS_HEADS, 15, 0,
     NULL, 50, ATTND_ELEM_F16, 0, 0},
    {"v2 JSON top-k values listed", API_V2, ENC_JSON, 1, 3000, 40, 8, 2, 0, ATTN_WEIGHTS_MEAN, 0, 8,
     NULL, 9, ATTND_ELEM_BF16, 0, 0},
    {"v2 binary FP16 attention", API_V2, ENC_JSON, 1, 300, 300, 8, 4, 0, ATTN_WEIGHTS_HEADS, 2, 0,
     NULL, 0, ATTND_ELEM_F16, 0, 0},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    uint32_t u = (uint32_t)(g_rng >> 32);
    switch (u % 8) { /* long and short texts, signs, exact and tiny values */
    case 0:
        return 0.0f;
    case 1:
        return -1.0f;
    case 2:
        return (float)(u % 1000);
    case 3:
        return ((float)u / 4294967296.0f - 0.5f) * 1e-30f;
    default:
        return ((float)u / 4294967296.0f - 0.5f) * 7.0f;
    }
}

/* An answer ready to write, with its own job, model and data. */
typedef struct {
    attnd_job job;
    attnd_model_info model;
    float *out;
    attnd_usage usage;
} fixture;

static void fixture_init(fixture *f, const acase *c) {
    memset(f, 0, sizeof *f);
    f->model.name = "m\"odel";
    f->model.hp.embed_dim = c->E;
    f->model.hp.num_heads = c->H;
    attnd_job *j = &f->job;
    j->api = c->api;
    j->enc = c->enc;
    j->B = c->B;
    j->L = c->L;
    j->S = c->S;
    j->rank3 = c->rank3;
    j->weights = c->weights;
    j->v2_binary = c->v2_binary;
    j->v2_outputs = c->v2_outputs;
    j->v2_id = c->api == API_V2 ? strdup("req-7") : NULL;
    size_t nout = (size_t)c->B * c->L * c->E;
    f->out = malloc(nout * sizeof(float));
    ck_assert_ptr_nonnull(f->out);
    for (size_t i = 0; i < nout; i++)
        f->out[i] = rnd();
    j->sel.top_k = c->top_k;
    j->sel.dtype = c->dtype;
    if (c->rows) {
        j->sel.row0 = 1;
        j->sel.row1 = 1 + c->rows;
    }
    if (c->heads) {
        j->sel.heads = malloc(sizeof(int) * (size_t)c->heads);
        ck_assert_ptr_nonnull(j->sel.heads);
        for (int h = 0; h < c->heads; h++)
            j->sel.heads[h] = c->H - 1 - h;
        j->sel.n_heads = c->heads;
    }
    uint64_t na = attnd_job_attention_floats(j, c->H);
    ck_assert(na != UINT64_MAX);
    if (na) {
        j->attn = malloc(na * sizeof(float));
        ck_assert_ptr_nonnull(j->attn);
        for (size_t i = 0; i < na; i++)
            j->attn[i] = rnd();
    }
    if (na && c->top_k) {
        j->attn_idx = malloc(na * sizeof(int32_t));
        ck_assert_ptr_nonnull(j->attn_idx);
        for (size_t i = 0; i < na; i++)
            j->attn_idx[i] = (int32_t)(i * 7919 % (size_t)c->S);
    }
    f->usage = (attnd_usage){.batch_requests = 3,
                             .queue_us = 17,
                             .compute_us = 12345,
                             .session = c->session,
                             .cached_tokens = c->S};
}

static void fixture_free(fixture *f) {
    attnd_job_free(&f->job);
    free(f->out);
}

/* The plain writer's bytes. */
typedef struct {
    char *body;
    size_t len, json_len;
} plain;

static plain write_plain(const fixture *f) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    plain p = {0};
    ck_assert_int_eq(attnd_write_answer(&b, &f->job, &f->model, f->out, &f->usage, &p.json_len), 0);
    p.body = attnd_sb_take(&b, &p.len);
    ck_assert_ptr_nonnull(p.body);
    return p;
}

typedef struct {
    atomic_int *calls; /* (n) done() calls per answer */
} tally;

static void on_done(void *arg, int i) {
    tally *t = arg;
    atomic_fetch_add(&t->calls[i], 1);
}

/* Writes the answers of cases idx[0..n) at once on ctx, and each against
 * the plain writer. */
static void check_batch(attn_ctx *ctx, const int *idx, int n, const char *how) {
    fixture *f = calloc((size_t)n, sizeof *f);
    attnd_answer *a = calloc((size_t)n, sizeof *a);
    tally t = {calloc((size_t)n, sizeof(atomic_int))};
    ck_assert(f && a && t.calls);
    for (int k = 0; k < n; k++) {
        fixture_init(&f[k], &CASES[idx[k]]);
        a[k] = (attnd_answer){
            .job = &f[k].job, .model = &f[k].model, .out = f[k].out, .usage = f[k].usage};
    }
    attnd_write_answers(ctx, a, n, on_done, &t);
    for (int k = 0; k < n; k++) {
        const acase *c = &CASES[idx[k]];
        ck_assert_msg(atomic_load(&t.calls[k]) == 1, "%s (%s): done called %d times", c->what, how,
                      atomic_load(&t.calls[k]));
        ck_assert_msg(a[k].body != NULL, "%s (%s): no body", c->what, how);
        plain p = write_plain(&f[k]);
        size_t at = 0;
        while (at < p.len && at < a[k].body_len && p.body[at] == a[k].body[at])
            at++;
        ck_assert_msg(a[k].body_len == p.len && at == p.len,
                      "%s (%s): %zu bytes, the plain writer %zu; first difference at byte %zu "
                      "(\"%.40s\" against \"%.40s\")",
                      c->what, how, a[k].body_len, p.len, at, a[k].body + at, p.body + at);
        ck_assert_msg(a[k].body[a[k].body_len] == '\0', "%s (%s): no NUL after the body", c->what,
                      how);
        ck_assert_msg(a[k].json_len == p.json_len, "%s (%s): json_len %zu, the plain writer %zu",
                      c->what, how, a[k].json_len, p.json_len);
        free(p.body);
        free(a[k].body);
        fixture_free(&f[k]);
    }
    free(t.calls);
    free(a);
    free(f);
}

/* Each case alone, on no pool and on pools of 1, 2 and 3 threads. */
START_TEST(test_each_alone_same_bytes) {
    attn_ctx *ctx[4] = {NULL, attn_ctx_new(1), attn_ctx_new(2), attn_ctx_new(3)};
    const char *how[4] = {"no pool", "1 thread", "2 threads", "3 threads"};
    for (int p = 1; p < 4; p++)
        ck_assert_ptr_nonnull(ctx[p]);
    for (int p = 0; p < 4; p++)
        for (int i = 0; i < NCASES; i++)
            check_batch(ctx[p], &i, 1, how[p]);
    for (int p = 1; p < 4; p++)
        attn_ctx_free(ctx[p]);
}
END_TEST

/* Every case in one call, small and large answers mixed, twice over. */
START_TEST(test_all_at_once_same_bytes) {
    int idx[2 * NCASES];
    for (int i = 0; i < 2 * NCASES; i++)
        idx[i] = (i * 7) % NCASES;
    attn_ctx *ctx = attn_ctx_new(3);
    ck_assert_ptr_nonnull(ctx);
    check_batch(ctx, idx, 2 * NCASES, "all at once, 3 threads");
    attn_ctx_free(ctx);
}
END_TEST

/* A session step's fields come first, in place: the id and the cached
 * tokens lead a native answer and a v2 answer's parameters. */
START_TEST(test_session_fields_in_place) {
    const acase *native = &CASES[15], *v2 = &CASES[17];
    ck_assert_ptr_nonnull(native->session);
    ck_assert_ptr_nonnull(v2->session);
    fixture f;
    fixture_init(&f, native);
    plain p = write_plain(&f);
    const char *want = "{\"session\":\"s-\\\"1\\\"\",\"cached_tokens\":1200,\"model\":";
    ck_assert_msg(strncmp(p.body, want, strlen(want)) == 0, "native answer starts %.80s", p.body);
    free(p.body);
    fixture_free(&f);
    fixture_init(&f, v2);
    p = write_plain(&f);
    want = ",\"parameters\":{\"session_id\":\"abc\",\"cached_tokens\":12000,\"batch\":3,";
    char *at = strstr(p.body, want);
    ck_assert_msg(at != NULL && (size_t)(at - p.body) < p.json_len, "v2 answer: %.200s", p.body);
    ck_assert_ptr_null(strstr(at + strlen(want), "session_id")); /* once */
    free(p.body);
    fixture_free(&f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_answer");
    TCase *tc = tcase_create("answer");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_each_alone_same_bytes);
    tcase_add_test(tc, test_all_at_once_same_bytes);
    tcase_add_test(tc, test_session_fields_in_place);
    suite_add_tcase(s, tc);
    return check_run(s);
}
