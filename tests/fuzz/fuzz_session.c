/* fuzz_session.c - libFuzzer target: the bytes are the body of POST
 * /v1/sessions (an open, with a prefix or without) and then of POST
 * /v1/sessions/{id}/attention (a step of an empty session), read by
 * server/batch/steps.c the daemon's way: the request reader, then the session
 * table. Once with both fuzz models served, once with "small" alone (where
 * a body naming no model opens one of it). An accepted open or step is one
 * sequence, causal, inside every limit, with an answer that is valid JSON
 * (fuzz_server.h); an open without a prefix computes nothing and holds an
 * empty session; a refusal carries a status and a sentence and opens
 * nothing. Every begun step is released, and the table freed, so a leak
 * is a finding (ASan).
 *   make fuzz-smoke; make fuzz-long
 */
#include "../../server/batch/steps.h"
#include "fuzz_server.h"

static const attnd_session_limits LIMITS = {4, 1 << 20, 1 << 16, 60};

/* What the table holds now. */
static attnd_session_stats stats_of(attnd_sessions *t) {
    attnd_session_stats st;
    attnd_sessions_stats(t, &st);
    return st;
}

/* One request on the session route se names; returns 0 when it opened an
 * empty session, 1 when it began a step, -1 when refused. */
static int one(const attnd_step_env *se, const uint8_t *data, size_t size) {
    attnd_job job;
    attnd_step_req *sr = NULL;
    attnd_error e;
    char opened[ATTND_SESSION_ID_LEN + 1];
    int retry = 0;
    memset(&e, 0, sizeof(e));
    attnd_session_stats before = stats_of(se->table);
    if (attnd_step_prepare(se, (const char *)data, size, &job, &sr, opened, &e, &retry) < 0) {
        fuzz_check_refusal(&e, &job);
        FUZZ_CHECK(sr == NULL);
        FUZZ_CHECK(stats_of(se->table).opened == before.opened);
        return -1;
    }
    if (!sr) { /* opened without a prefix */
        FUZZ_CHECK(!se->id && strlen(opened) == ATTND_SESSION_ID_LEN);
        FUZZ_CHECK(job.query == NULL && job.model >= 0 && job.model < se->env->n_models);
        FUZZ_CHECK(stats_of(se->table).sessions == before.sessions + 1);
        return 0;
    }
    FUZZ_CHECK(job.B == 1 && job.self && job.causal && !job.kpm && !job.positions);
    FUZZ_CHECK(job.S == sr->st.len + job.L && sr->st.add == job.L);
    FUZZ_CHECK(!job.mask_bool && !job.mask_add);
    fuzz_check_job(&job);
    attnd_step_release(sr, se->now);
    attnd_job_free(&job);
    return 1;
}

static void run(const attnd_parse_env *env, const uint8_t *data, size_t size) {
    attnd_model_config mc[2];
    memset(mc, 0, sizeof(mc));
    attnd_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.models = mc;
    cfg.n_models = env->n_models;
    attnd_sessions *t = attnd_sessions_new(&LIMITS);
    FUZZ_CHECK(t != NULL);
    attnd_step_env se = {t, env, &cfg, NULL, NULL, 1.0};
    one(&se, data, size); /* an open */
    /* a step of an empty session of "small" */
    static const char open_small[] = "{\"model\": \"small\"}";
    attnd_job job;
    attnd_step_req *sr = NULL;
    attnd_error e;
    char id[ATTND_SESSION_ID_LEN + 1];
    int retry = 0;
    int rc = attnd_step_prepare(&se, open_small, sizeof(open_small) - 1, &job, &sr, id, &e, &retry);
    FUZZ_CHECK(rc == 0 && sr == NULL); /* room for 4: the open above took one at most */
    se.id = id;
    se.now = 2.0;
    one(&se, data, size);
    attnd_sessions_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    attnd_parse_env one_model = FUZZ_ENV;
    one_model.n_models = 1;
    run(&FUZZ_ENV, data, size);
    run(&one_model, data, size);
    return 0;
}
