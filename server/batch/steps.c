/* steps.c - KV-cache sessions between the parser and the core (steps.h):
 * bodies of the session routes into jobs and begun steps, batches of steps
 * through attn_step_forward, their answers, and the release of steps that
 * never computed. It opens no sockets and holds no lock of its own.
 */
#include "steps.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/buffer.h"
#include "../base/clock.h"
#include "../base/utf8.h"
#include "../body/answer.h"
#include "../codec/tensor.h"
#include "../obs/prom.h"
#include "sched.h"

double attnd_step_now(void) {
    return (double)attnd_mono_us() / 1e6;
}

/* What a session step may carry: rows of one sequence, no key, no masks. */
static int check_job(const attnd_job *job, const attnd_model_info *mi, attnd_error *e) {
    const char *extra = !job->self                        ? "key"
                        : job->kpm                        ? "key_padding_mask"
                        : job->mask_bool || job->mask_add ? "attn_mask"
                        : job->positions                  ? "positions"
                                                          : NULL;
    if (extra)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: a session step takes query rows only: no key, value, "
                               "key_padding_mask, attn_mask or positions (it is causal over "
                               "the cache, its rows at the positions after it)",
                               extra);
    if (job->B != 1)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "query: a session holds one sequence; send L x %d rows, not a "
                               "batch of %d",
                               mi->hp.embed_dim, job->B);
    return 0;
}

/* The kind of answer each refusal of the session table gets. */
static const attnd_kind SESSION_KIND[] = {
    [SESS_NOT_FOUND] = AERR_NOT_FOUND, [SESS_BUSY] = AERR_CONFLICT,
    [SESS_FULL] = AERR_QUEUE_FULL,     [SESS_TOO_BIG] = AERR_TOO_LARGE,
    [SESS_TOO_LONG] = AERR_TOO_LARGE,  [SESS_NOMEM] = AERR_INTERNAL,
    [SESS_ID_TAKEN] = AERR_CONFLICT,   [SESS_BAD_ID] = AERR_BAD_REQUEST,
};

/* Begins the open or the step of n rows of model mi. Returns 0, or -1 with
 * e saying why the session table refused (*retry set with a full one). */
static int begin(const attnd_step_env *se, int mi, int n, attnd_step_req *sr, int *retry,
                 attnd_error *e) {
    const attn_hparams *hp = &se->env->models[mi].hp;
    int G = hp->num_kv_heads ? hp->num_kv_heads : hp->num_heads;
    int D = hp->head_dim ? hp->head_dim : hp->embed_dim / hp->num_heads;
    int max_len =
        se->cfg->models[mi].max_positions ? se->cfg->models[mi].max_positions : INT32_MAX / 2;
    attnd_session_status s;
    if (se->id) {
        snprintf(sr->id, sizeof sr->id, "%s", se->id);
        s = attnd_session_begin(se->table, se->id, n, se->now, &sr->st, retry);
    } else {
        sr->opened = 1;
        s = attnd_session_open(se->table, mi, 2 * (size_t)G * D, n, max_len, se->now, se->want_id,
                               sr->id, &sr->st, retry);
    }
    if (s == SESS_OK) return 0;
    if (s == SESS_NOT_FOUND)
        return attnd_set_error(e, AERR_NOT_FOUND, ATTND_MSG_NO_SESSION, se->id ? se->id : "",
                               attnd_session_status_text(s));
    return attnd_set_error(e, SESSION_KIND[s], "%s", attnd_session_status_text(s));
}

int attnd_step_prepare(const attnd_step_env *se, const char *body, size_t len, attnd_job *job,
                       attnd_step_req **out, char opened_id[ATTND_SESSION_ID_LEN + 1],
                       attnd_error *e, int *retry_after_s) {
    *out = NULL;
    *retry_after_s = 0;
    opened_id[0] = '\0';
    attnd_sessions_expire(se->table, se->now);
    if (se->id) { /* a step: the session's model reads the body */
        int mi = attnd_session_model(se->table, se->id, se->now);
        if (mi < 0)
            return attnd_set_error(e, AERR_NOT_FOUND, ATTND_MSG_NO_SESSION, se->id,
                                   attnd_session_status_text(SESS_NOT_FOUND));
        if (attnd_parse_native(se->env, se->env->models[mi].name, body, len, job, e) < 0) return -1;
        return attnd_step_from_job(se, job, out, e, retry_after_s);
    }
    int prefix = attnd_parse_session_open(se->env, body, len, job, e);
    if (prefix < 0) return -1;
    if (prefix) return attnd_step_from_job(se, job, out, e, retry_after_s);
    /* an open with no prefix: nothing to compute */
    attnd_step_req sr = {.table = se->table};
    if (begin(se, job->model, 0, &sr, retry_after_s, e) < 0) return -1;
    memcpy(opened_id, sr.id, sizeof sr.id);
    attnd_session_end(se->table, &sr.st, 1, se->now);
    return 0;
}

int attnd_step_from_job(const attnd_step_env *se, attnd_job *job, attnd_step_req **out,
                        attnd_error *e, int *retry_after_s) {
    *out = NULL;
    *retry_after_s = 0;
    char idbuf[ATTND_SESSION_ID_LEN + 8]; /* se->id may live in the job, freed on failure */
    attnd_step_env local = *se;
    if (se->id) {
        snprintf(idbuf, sizeof idbuf, "%s", se->id);
        local.id = idbuf;
    }
    se = &local;
    attnd_step_req *sr = calloc(1, sizeof *sr);
    if (!sr) {
        attnd_job_free(job);
        return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    sr->table = se->table;
    int mi = se->id ? attnd_session_model(se->table, se->id, se->now) : job->model;
    if (mi < 0 || check_job(job, &se->env->models[job->model], e) < 0) {
        if (mi < 0)
            attnd_set_error(e, AERR_NOT_FOUND, ATTND_MSG_NO_SESSION, se->id,
                            attnd_session_status_text(SESS_NOT_FOUND));
        attnd_job_free(job);
        free(sr);
        return -1;
    }
    if (mi != job->model) {
        attnd_set_error(e, AERR_BAD_REQUEST, "session '%.40s' belongs to model '%s', not '%s'",
                        se->id, se->env->models[mi].name, se->env->models[job->model].name);
        attnd_job_free(job);
        free(sr);
        return -1;
    }
    if (begin(se, job->model, job->L, sr, retry_after_s, e) < 0) {
        attnd_job_free(job);
        free(sr);
        return -1;
    }
    job->S = sr->st.len + job->L;
    job->causal = 1;
    if (attnd_attention_limit(se->env, job, 1, e) < 0) {
        attnd_step_release(sr, se->now);
        attnd_job_free(job);
        return -1;
    }
    *out = sr;
    return 0;
}

char *attnd_step_open_answer(const char *id, const char *model, size_t *len) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{\"session\":");
    attnd_sb_json_str(&b, id);
    attnd_sb_puts(&b, ",\"model\":");
    attnd_sb_json_str(&b, model);
    attnd_sb_puts(&b, ",\"cached_tokens\":0}\n");
    return attnd_sb_take(&b, len);
}

void attnd_step_release(attnd_step_req *sr, double now) {
    if (!sr) return;
    attnd_session_end(sr->table, &sr->st, 0, now);
    free(sr);
}

/* ---- computing a batch of steps ---------------------------------------- */

/* A batch of steps on its way through attnd_steps_run. */
typedef struct {
    attnd_req **rs;
    int n;
    int E, H;
    attn_step *st;         /* (n) the core's view of each step */
    float **outs;          /* (n) each step's output rows (L, E), owned */
    int *ok;               /* (n) 1: computed, finite and written; -1: not finite */
    attnd_answer *answers; /* (n) the answers being written */
    int *who;              /* (n) answers[a] is rs[who[a]]'s */
    int fail;              /* 1: nothing computed; err says why */
    char err[256];
} steps_run;

/* The batch's arrays, each step's output and attention buffers, and the
 * core's view of each step; on failure b->fail. */
static void steps_alloc(steps_run *b) {
    int n = b->n;
    b->st = calloc((size_t)n, sizeof *b->st);
    b->outs = calloc((size_t)n, sizeof *b->outs);
    b->ok = calloc((size_t)n, sizeof *b->ok);
    b->answers = calloc((size_t)n, sizeof *b->answers);
    b->who = calloc((size_t)n, sizeof *b->who);
    b->fail = !b->st || !b->outs || !b->ok || !b->answers || !b->who;
    for (int i = 0; i < n && !b->fail; i++) {
        attnd_job *j = &b->rs[i]->job;
        attnd_session_step *ss = &b->rs[i]->step->st;
        uint64_t na = attnd_job_attention_floats(j, b->H);
        b->outs[i] = malloc(sizeof(float) * (size_t)j->L * b->E);
        free(j->attn);
        j->attn = na ? malloc(sizeof(float) * na) : NULL;
        b->fail = !b->outs[i] || (na && !j->attn);
        b->st[i] = (attn_step){.n = j->L,
                               .len = ss->len,
                               .kv = ss->kv,
                               .query = j->query,
                               .out = b->outs[i],
                               .weights = j->weights,
                               .attn = j->attn};
    }
    if (b->fail) snprintf(b->err, sizeof b->err, "out of memory for a batch of steps");
}

/* Answer a, written (answer.c), into its request: 201 for a native open. */
static void step_written(void *arg, int a) {
    steps_run *b = arg;
    const attnd_answer *an = &b->answers[a];
    attnd_req *r = b->rs[b->who[a]];
    if (!an->body) return; /* out of memory: not ok, answered as a failure */
    attnd_reply_set(&r->reply, r->step->opened && r->job.api != API_V2 ? AOK_CREATED : AOK,
                    an->body, an->body_len, an->json_len);
    b->ok[b->who[a]] = 1;
}

/* The answers of the computed, finite steps, written over the pool; each
 * carries its session's id and cached tokens in place (answer.c). */
static void steps_write(steps_run *b, attn_ctx *ctx, const attnd_model_info *info, uint64_t t0,
                        uint64_t t1) {
    int na = 0;
    for (int i = 0; i < b->n && !b->fail; i++) {
        attnd_req *r = b->rs[i];
        attnd_job *j = &r->job;
        size_t nout = (size_t)j->L * b->E;
        size_t nattn = j->attn ? attnd_job_attention_floats(j, b->H) : 0;
        if (attnd_first_nonfinite(b->outs[i], nout, 0) != nout ||
            attnd_first_nonfinite(j->attn, nattn, 0) != nattn) {
            b->ok[i] = -1; /* the rows' magnitudes: the client's error */
            continue;
        }
        b->who[na] = i;
        b->answers[na++] = (attnd_answer){.job = j,
                                          .model = info,
                                          .out = b->outs[i],
                                          .usage = {.batch_requests = b->n,
                                                    .queue_us = t0 - r->t_admit_us,
                                                    .compute_us = t1 - t0,
                                                    .session = r->step->id,
                                                    .cached_tokens = j->S}};
    }
    attnd_write_answers(ctx, b->answers, na, step_written, b);
}

/* Ends every step (kept when answered, dropped when not; an open that was
 * not answered takes its session with it) and answers the others with an
 * error: a bad request for a result that is not finite, internal for the
 * rest. */
static void steps_end(steps_run *b, uint64_t t0, uint64_t t1) {
    double now = attnd_step_now();
    for (int i = 0; i < b->n; i++) {
        attnd_req *r = b->rs[i];
        int ok = b->ok && b->ok[i] == 1;
        attnd_session_end(r->step->table, &r->step->st, ok, now);
        if (!ok) {
            attnd_error e;
            if (b->ok && b->ok[i] == -1)
                attnd_set_error(&e, AERR_BAD_REQUEST, "%s", ATTND_MSG_OVERFLOW);
            else
                attnd_set_error(&e, AERR_INTERNAL, "compute failed: %.200s",
                                b->err[0] ? b->err : "out of memory writing the answer");
            attnd_reply_error(&r->reply, &e);
        }
        r->t_start_us = t0;
        r->t_end_us = t1;
        r->batch_requests = b->n;
        free(b->outs ? b->outs[i] : NULL);
    }
}

void attnd_steps_run(attn_ctx *ctx, const attn_model *m, const attnd_model_info *info,
                     attnd_req **rs, int n, uint64_t *t0, uint64_t *t1) {
    steps_run b = {.rs = rs, .n = n, .E = m->hp.embed_dim, .H = m->hp.num_heads};
    steps_alloc(&b);
    *t0 = attnd_mono_us();
    if (!b.fail && attn_step_forward(ctx, m, b.st, n, b.err, sizeof b.err) < 0) b.fail = 1;
    *t1 = attnd_mono_us();
    steps_write(&b, ctx, info, *t0, *t1);
    steps_end(&b, *t0, *t1);
    free(b.outs);
    free(b.st);
    free(b.ok);
    free(b.answers);
    free(b.who);
}

void attnd_steps_metrics(attnd_sessions *t, attnd_sbuf *b) {
    attnd_session_stats st;
    attnd_sessions_stats(t, &st);
    attnd_prom_single(b, "attnd_sessions", PROM_GAUGE, "KV-cache sessions open.", st.sessions);
    attnd_prom_single(b, "attnd_session_cached_tokens", PROM_GAUGE,
                      "Tokens held by every session's cache.", st.tokens);
    attnd_prom_single(b, "attnd_session_bytes", PROM_GAUGE, "Bytes the session caches hold.",
                      st.bytes);
    attnd_prom_single(b, "attnd_sessions_opened_total", PROM_COUNTER, "Sessions opened.",
                      (long long)st.opened);
    attnd_prom_single(b, "attnd_sessions_deleted_total", PROM_COUNTER,
                      "Sessions closed by their client.", (long long)st.deleted);
    const attnd_prom_label idle = {"reason", "idle"}, full = {"reason", "full"},
                           big = {"reason", "too_large"};
    attnd_prom_family(b, "attnd_session_evictions_total", PROM_COUNTER,
                      "Sessions ended by attnd: the idle timeout.");
    attnd_prom_sample(b, "attnd_session_evictions_total", &idle, 1, (long long)st.expired);
    attnd_prom_family(b, "attnd_session_refused_total", PROM_COUNTER,
                      "Opens and steps refused, by reason.");
    attnd_prom_sample(b, "attnd_session_refused_total", &full, 1, (long long)st.refused_full);
    attnd_prom_sample(b, "attnd_session_refused_total", &big, 1, (long long)st.refused_too_big);
}
