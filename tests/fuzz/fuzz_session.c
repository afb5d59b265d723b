/* fuzz_session.c - libFuzzer target: the session routes and the v2 session
 * dispatch, down to a computed step. The bytes are a request body, sent
 * three ways to a table that holds a session SID of "small" (opened with
 * X-Session-Id SID, two rows cached): as the body of POST /v1/sessions (an
 * open, with a prefix or without), of POST /v1/sessions/SID/attention (a
 * step), and of POST /v2/models/small/infer, whose parameters may open a
 * session or step one (session_open, session_id), with an X-Session-Id
 * passed as a plain string (none, a free id, or one that is no id, by the
 * input's length). Each goes the daemon's way without a connection:
 * server/body/request.c reads it, server/batch/admit.c dispatches it to
 * the session table, and an admitted job is computed through
 * server/batch/pipeline.c on the weights of the version it was admitted
 * on (the fuzz models' tables, fuzz_server.h). Once with both fuzz models
 * served, once with "small" alone.
 *
 * Checked: an admitted session job is one sequence, causal over the cache,
 * inside every limit (fuzz_server.h), and its answer is its 200 (201 for a
 * native open), valid JSON that names its session and cached tokens, and
 * the session then holds its rows; or a 400 for a result that overflows,
 * and the session holds what it held. A refusal carries a status and a
 * sentence and changes no session. No step is left begun, and the table
 * is freed at the end, so a leak is a finding (ASan).
 *   make fuzz-smoke; make fuzz-long
 */
#include "../../server/base/clock.h"
#include "../../server/batch/admit.h"
#include "../../server/batch/pipeline.h"
#include "fuzz_server.h"

#define SID "0123456789abcdef0123456789abcdef"
#define FREE_ID "fedcba9876543210fedcba9876543210"

static const attnd_session_limits LIMITS = {4, 1 << 20, 1 << 16, 60};

/* The compute of every admitted job, on the version it was admitted on. */
static attn_ctx *ctx;
static attnd_pipeline *pipe_;

static void start_once(void) {
    if (ctx) return;
    ctx = attn_ctx_new(1);
    pipe_ = attnd_pipeline_new(ctx, 4);
    FUZZ_CHECK(ctx && pipe_);
}

typedef struct {
    attnd_req r;
    int answered;
} freq;

static void freq_free(attnd_req *r) {
    attnd_req_clear(r);
    free(r);
}

static void on_answered(void *arg, attnd_req *r) {
    (void)arg;
    ((freq *)r)->answered++;
}

static attnd_session_stats stats_of(attnd_sessions *t) {
    attnd_session_stats st;
    attnd_sessions_stats(t, &st);
    return st;
}

/* A computed session job's answer: its status, its JSON, its session's
 * rows kept (or, refused, nothing changed). */
static void check_answer(attnd_sessions *t, const freq *f, const attnd_session_stats *before) {
    const attnd_job *job = &f->r.job;
    attnd_session_stats after = stats_of(t);
    FUZZ_CHECK(f->answered == 1 && !f->r.step.st.s); /* answered once, its step ended */
    if (f->r.reply.kind == AERR_BAD_REQUEST) {       /* a result past float32 */
        FUZZ_CHECK(strstr(f->r.reply.body, "overflows float32") != NULL);
        FUZZ_CHECK(after.tokens == before->tokens);
        return;
    }
    int native_open = f->r.step.opened && job->api == API_NATIVE;
    FUZZ_CHECK(f->r.reply.kind == (native_open ? AOK_CREATED : AOK));
    FUZZ_CHECK(after.tokens == before->tokens + job->L);
    json_t *doc = json_loadb(f->r.reply.body,
                             f->r.reply.json_len ? f->r.reply.json_len : f->r.reply.len, 0, NULL);
    FUZZ_CHECK(doc != NULL);
    json_t *fields = job->api == API_V2 ? json_object_get(doc, "parameters") : doc;
    const char *id =
        json_string_value(json_object_get(fields, job->api == API_V2 ? "session_id" : "session"));
    FUZZ_CHECK(id && strcmp(id, f->r.step.id) == 0);
    FUZZ_CHECK(json_integer_value(json_object_get(fields, "cached_tokens")) == job->S);
    json_decref(doc);
}

/* An admitted job, before it computes: a step's shape and limits. */
static void check_admitted(const freq *f) {
    const attnd_job *job = &f->r.job;
    const attnd_session_step *st = &f->r.step.st;
    FUZZ_CHECK(job->B == 1 && job->self && job->causal && !job->kpm && !job->positions);
    FUZZ_CHECK(!job->mask_bool && !job->mask_add);
    FUZZ_CHECK(job->S == st->len + job->L && st->add == job->L && f->r.tokens == job->L);
    fuzz_check_job(job);
}

/* f, parsed (or not: parsed < 0 with e set), admitted and computed. */
static void admit_and_run(attnd_sessions *t, const attnd_parse_env *env, freq *f, int parsed,
                          attnd_error *e, const char *x_session_id) {
    attnd_session_stats before = stats_of(t);
    int rc = -1, retry = 0;
    if (parsed >= 0) {
        attnd_admit_env a = {t, env};
        rc = attnd_admit(&a, &f->r, x_session_id, attnd_mono_s(), e, &retry);
    }
    if (rc < 0) { /* refused by the reader or the dispatch: nothing changes */
        FUZZ_CHECK(attnd_kind_is_error(e->code) && e->msg[0] && !f->r.step.st.s);
        FUZZ_CHECK(stats_of(t).opened == before.opened && stats_of(t).tokens == before.tokens);
        return;
    }
    if (rc == 1) { /* an open without a prefix: answered at once, nothing computed */
        FUZZ_CHECK(f->r.reply.kind == AOK_CREATED && !f->r.step.st.s);
        FUZZ_CHECK(strstr(f->r.reply.body, "\"cached_tokens\":0") != NULL);
        FUZZ_CHECK(stats_of(t).sessions == before.sessions + 1);
        return;
    }
    if (f->r.step.table) check_admitted(f);
    attnd_req *rs[1] = {&f->r};
    attnd_version *v = f->r.job.ver;
    attnd_pipeline_run(pipe_, &v->model, &v->info, NULL, rs, 1, on_answered, NULL);
    if (f->r.step.table) {
        check_answer(t, f, &before);
    } else { /* a v2 body of no session: computed the same road */
        FUZZ_CHECK(f->answered == 1 && stats_of(t).tokens == before.tokens);
        FUZZ_CHECK(f->r.reply.kind == AOK || f->r.reply.kind == AERR_BAD_REQUEST);
    }
}

static freq *freq_new(void) {
    freq *f = calloc(1, sizeof *f);
    FUZZ_CHECK(f != NULL);
    attnd_req_init(&f->r, freq_free);
    f->r.deadline_us = UINT64_MAX;
    return f;
}

/* The body three ways: a native open, a native step of SID, a v2 infer. */
static void three_ways(attnd_sessions *t, const attnd_parse_env *env, const char *body, size_t size,
                       const char *x_session_id) {
    attnd_error e;
    freq *f = freq_new();
    int rc = attnd_parse_session_open(env, body, size, &f->r.job, &e);
    admit_and_run(t, env, f, rc, &e, x_session_id);
    attnd_req_unref(&f->r);
    f = freq_new();
    attnd_version *small = attnd_session_model(t, SID, attnd_mono_s()); /* held */
    FUZZ_CHECK(small && strcmp(small->name, "small") == 0);
    rc = attnd_parse_session_step(env, small, SID, body, size, &f->r.job, &e);
    attnd_version_unref(small);
    admit_and_run(t, env, f, rc, &e, x_session_id);
    attnd_req_unref(&f->r);
    f = freq_new();
    rc = attnd_parse_v2(env, "small", body, size, 0, &f->r.job, &e);
    admit_and_run(t, env, f, rc, &e, x_session_id);
    attnd_req_unref(&f->r);
}

/* SID opened with X-Session-Id and a prefix of two rows. */
static void open_sid(attnd_sessions *t, const attnd_parse_env *env) {
    static const char prefix[] = "{\"model\": \"small\", \"query\": [[0.5, -1, 2, 0.25], "
                                 "[1, 1, -0.5, 0]]}";
    attnd_error e;
    freq *f = freq_new();
    int rc = attnd_parse_session_open(env, prefix, sizeof prefix - 1, &f->r.job, &e);
    FUZZ_CHECK(rc == 1);
    admit_and_run(t, env, f, rc, &e, SID);
    FUZZ_CHECK(f->answered == 1 && strcmp(f->r.step.id, SID) == 0);
    attnd_req_unref(&f->r);
}

/* Each version of env's table is held by the table alone: no job, step
 * or session kept a reference once all are done. */
static void check_versions_let_go(const attnd_parse_env *env) {
    for (int i = 0; i < attnd_models_slots(env->models); i++) {
        attnd_error e;
        attnd_version *v = attnd_models_get(env->models, FUZZ_NAMES[i], &e);
        FUZZ_CHECK(v != NULL && atomic_load(&v->refs) == 2); /* the table's and this one */
        attnd_version_unref(v);
    }
}

static void run(const attnd_parse_env *env, const uint8_t *data, size_t size) {
    static const char *const header[] = {NULL, FREE_ID, "not-a-session-id"};
    attnd_sessions *t = attnd_sessions_new(&LIMITS);
    FUZZ_CHECK(t != NULL);
    attnd_sessions_hooks(t, test_version_hold, test_version_drop); /* as the daemon's */
    open_sid(t, env);
    three_ways(t, env, (const char *)data, size, header[size % 3]);
    attnd_sessions_free(t);
    check_versions_let_go(env);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    start_once();
    run(fuzz_env(2), data, size);
    run(fuzz_env(1), data, size);
    return 0;
}
