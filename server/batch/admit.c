/* admit.c - admission and the session dispatch (admit.h): a parsed job's
 * tokens, and for a session job its step begun in the session table. */
#include "admit.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../body/answer.h"
#include "../body/selection.h"

/* A step's job on its session's version: the one the session was opened
 * on. A v2 step is read against it already when the parser could ask
 * (attnd_parse_env.session_version); one read against the version serving
 * learns it here. 0, or -1 with e set. */
static int on_session_version(attnd_job *job, attnd_version *sv, attnd_error *e) {
    if (sv->slot != job->model)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "session '%.40s' belongs to model '%s', not '%s'", job->session_id,
                               sv->name, job->ver->name);
    if (sv == job->ver) return 0;
    if (memcmp(&sv->info.hp, &job->ver->info.hp, sizeof sv->info.hp) != 0)
        return attnd_set_error(e, AERR_CONFLICT,
                               "session '%.40s' was opened on version %d of model '%s', whose "
                               "shape differs from version %d serving now; step it at "
                               "/v1/sessions/%.40s/attention",
                               job->session_id, sv->info.version, sv->name, job->ver->info.version,
                               job->session_id);
    attnd_version_ref(sv);
    attnd_version_unref(job->ver);
    job->ver = sv;
    return 0;
}

/* The session job's model against its session's: 0, or -1 with e set. */
static int check_session(const attnd_admit_env *a, attnd_job *job, double now, attnd_error *e) {
    if (job->session_id && job->session_open)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "parameters: give session_id (a step) or session_open, not both");
    attnd_sessions_expire(a->table, now);
    if (job->query && attnd_job_check_step(job, &job->ver->info, e) < 0) return -1;
    if (!job->session_id) return 0;
    attnd_version *sv = attnd_session_model(a->table, job->session_id, now);
    if (!sv) return attnd_session_refusal(SESS_NOT_FOUND, job->session_id, NULL, e);
    int rc = on_session_version(job, sv, e);
    attnd_version_unref(sv);
    return rc;
}

/* Begins the open (with want_id) or the step of `rows` rows in r->step. */
static int begin(const attnd_admit_env *a, attnd_req *r, int rows, const char *want_id, double now,
                 attnd_error *e, int *retry) {
    const attnd_model_info *m = &r->job.ver->info;
    const attn_hparams *hp = &m->hp; /* num_kv_heads and head_dim filled by the core */
    attnd_req_step *rs = &r->step;
    attnd_session_status s;
    if (r->job.session_id) {
        snprintf(rs->id, sizeof rs->id, "%s", r->job.session_id);
        s = attnd_session_begin(a->table, r->job.session_id, rows, now, &rs->st, retry);
    } else {
        int max_len = m->max_positions ? m->max_positions : ATTND_SESSION_MAX_LEN;
        attnd_cache_shape shape =
            attnd_session_cache_shape(hp->num_kv_heads, hp->head_dim, m->kv16);
        rs->opened = 1;
        s = attnd_session_open(a->table, r->job.ver, &shape, rows, max_len, now, want_id, rs->id,
                               &rs->st, retry);
    }
    if (s != SESS_OK) return attnd_session_refusal(s, r->job.session_id, &rs->st.over, e);
    rs->table = a->table; /* a step from here on */
    return 0;
}

/* An open without a prefix: the session opened empty, answered at once. */
static int open_empty(const attnd_admit_env *a, attnd_req *r, const char *want_id, double now,
                      attnd_error *e, int *retry) {
    if (begin(a, r, 0, want_id, now, e, retry) < 0) return -1;
    attnd_req_end_step(r, 1);
    size_t len = 0;
    char *body = attnd_write_open_answer(r->step.id, r->job.ver->name, 0, &len);
    if (!body) return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&r->reply, AOK_CREATED, body, len, 0);
    return 1;
}

/* parameters.session_close with no input: the session closed now, the
 * answer a v2 answer with no outputs. */
static int close_now(const attnd_admit_env *a, attnd_req *r, double now, attnd_error *e) {
    attnd_session_status s = attnd_session_delete(a->table, r->job.session_id, now);
    if (s != SESS_OK) return attnd_session_refusal(s, r->job.session_id, NULL, e);
    size_t len = 0;
    char *body = attnd_write_close_answer(&r->job, &len);
    if (!body) return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&r->reply, AOK, body, len, 0);
    return 1;
}

int attnd_admit(const attnd_admit_env *a, attnd_req *r, const char *x_session_id, double now,
                attnd_error *e, int *retry_after_s) {
    attnd_job *job = &r->job;
    *retry_after_s = 0;
    if (!job->session_id && !job->session_open) {
        r->tokens = attnd_job_tokens(job);
        return 0;
    }
    if (check_session(a, job, now, e) < 0) return -1;
    const char *want_id = job->session_open ? x_session_id : NULL;
    if (!job->query && job->session_close) return close_now(a, r, now, e);
    if (!job->query) return open_empty(a, r, want_id, now, e, retry_after_s);
    if (begin(a, r, job->L, want_id, now, e, retry_after_s) < 0) return -1;
    job->S = r->step.st.len + job->L;
    job->causal = 1;
    r->tokens = job->L;
    if (attnd_check_top_k(job, e) < 0 || attnd_attention_limit(a->env, job, 1, e) < 0) {
        attnd_req_end_step(r, 0); /* at once: the session's next step finds it free */
        return -1;
    }
    return 0;
}
