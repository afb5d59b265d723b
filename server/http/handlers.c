/* handlers.c - the route handlers of the table (routes.c), one function
 * per route or pair of routes: each answers into h->r.reply, or parses
 * its body (server/body/request.c, v2.c), admits the job (server/batch/admit.c:
 * the session dispatch of every API, X-Session-Id passed on as a plain
 * string) and queues it, and returns 0; or returns -1 with h->err set.
 * glue.c sends either, through send.c. Below the table, above hreq.c.
 */
#include <limits.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/clock.h"
#include "../base/utf8.h"
#include "../batch/admit.h"
#include "../body/answer.h"
#include "../body/v2.h"
#include "../session/persist.h"
#include "handlers.h"
#include "hreq.h"
#include "openapi.h"

/* The request body read so far (not NUL-terminated), "" when none. */
static const char *body_of(const hreq *h) {
    return h->in.p ? h->in.p : "";
}

/* A v2 route's {name} and {version}: the version of the model serving,
 * with a reference, or NULL with the 404 of an unknown model, or of a
 * {version} that is not the one serving. */
static attnd_version *path_model(hreq *h) {
    attnd_version *v = attnd_models_get(h->srv->env->models, h->rm.name, &h->err);
    if (!v || attnd_version_check(v, h->rm.version, &h->err) == 0) return v;
    attnd_version_unref(v);
    return NULL;
}

/* 503 unless the server is ready: "draining", or "starting" where the
 * route tells the two apart. */
static int ready(hreq *h, int says_starting) {
    int state = atomic_load(&h->srv->state);
    if (state == S_READY) return 0;
    return attnd_set_error(&h->err, AERR_UNAVAILABLE, "%s",
                           state == S_STARTING && says_starting ? "starting" : "draining");
}

/* A body written at start-up, answered as it is. */
static int borrowed(hreq *h, const char *body) {
    attnd_reply_borrow(&h->r.reply, AOK, body, strlen(body));
    return 0;
}

/* ---- routes that describe the server ---- */

/* GET /health */
int attnd_handle_health(hreq *h) {
    if (ready(h, 1) < 0) return -1;
    return borrowed(h, "{\"status\":\"ok\"}\n");
}

/* A body written for this answer, or the 500 of none. */
static int owned(hreq *h, char *body) {
    if (!body) return attnd_set_error(&h->err, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&h->r.reply, AOK, body, strlen(body), 0);
    return 0;
}

/* The Open Inference Protocol's readiness bodies, which its REST spec
 * gives and KServe's client reads: $ready_server_response {"ready": true},
 * or with model its $ready_model_response {"name": ..., "ready": true}.
 * Not ready is ready()'s 503 (Kubernetes' probes read the status), its
 * body the same with "ready": false beside the "error" every refusal
 * carries. */
static int readiness(hreq *h, const char *model, int says_starting) {
    int is_ready = ready(h, says_starting) == 0;
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_puts(&b, "{");
    if (model) {
        attnd_sb_puts(&b, "\"name\":");
        attnd_sb_json_str(&b, model);
        attnd_sb_puts(&b, ",");
    }
    attnd_sb_puts(&b, is_ready ? "\"ready\":true}\n" : "\"ready\":false");
    char *body = attnd_sb_take(&b, NULL);
    if (!body || is_ready) return owned(h, body);
    attnd_reply_error_with(&h->r.reply, &h->err, body + 1); /* the members, past "{" */
    free(body);
    return 0;
}

/* GET /v2/health/live: the protocol's $live_server_response; 200 as long
 * as the process answers. */
int attnd_handle_v2_live(hreq *h) {
    return borrowed(h, "{\"live\":true}\n");
}

/* GET /v2/health/ready */
int attnd_handle_v2_ready(hreq *h) {
    return readiness(h, NULL, 1);
}

/* The versions serving now, each held: *n of them in a malloc'd array
 * (NULL with *n 0 when none or out of memory). */
static attnd_version **serving(attnd_http *s, int *n) {
    int k = attnd_models_serving(s->env->models, NULL, 0);
    attnd_version **vs = calloc((size_t)(k ? k : 1), sizeof *vs);
    *n = vs ? attnd_models_serving(s->env->models, vs, k) : 0;
    if (*n > k) *n = k; /* one loaded meanwhile: left out of this answer */
    return vs;
}

static void unhold(attnd_version **vs, int n) {
    for (int i = 0; i < n; i++)
        attnd_version_unref(vs[i]);
    free(vs);
}

/* GET /v1/models */
int attnd_handle_models(hreq *h) {
    int n = 0;
    attnd_version **vs = serving(h->srv, &n);
    char *body = vs ? attnd_meta_models(h->srv->cfg, vs, n) : NULL;
    unhold(vs, n);
    return owned(h, body);
}

/* GET /metrics: the counters, the scheduler's gauges, the sessions', the
 * models'. */
int attnd_handle_metrics(hreq *h) {
    attnd_http *s = h->srv;
    int n = 0;
    attnd_version **vs = serving(s, &n);
    int *depth = calloc((size_t)(n ? n : 1), sizeof(int));
    const char **names = calloc((size_t)(n ? n : 1), sizeof(char *));
    attnd_sbuf b;
    attnd_sb_init(&b);
    int k = depth && names ? n : 0;
    for (int i = 0; i < k; i++) {
        depth[i] = attnd_sched_depth(s->sched, vs[i]->slot);
        names[i] = vs[i]->name;
    }
    attnd_metrics_write(s->metrics, &b, names, depth, k);
    attnd_sched_metrics(s->sched, &b);
    attnd_sessions_metrics(s->sessions, &b);
    attnd_models_metrics(s->env->models, &b);
    if (s->more_metrics) s->more_metrics(&b, s->more_metrics_arg);
    attnd_otlp_metrics(s->otlp, &b);
    unhold(vs, n);
    free(depth);
    free(names);
    size_t len = 0;
    char *body = attnd_sb_take(&b, &len);
    if (!body) return attnd_set_error(&h->err, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&h->r.reply, AOK, body, len, 0);
    h->ctype = "text/plain; version=0.0.4; charset=utf-8";
    return 0;
}

/* GET /openapi.json: the document of this daemon as it runs now (its key
 * setting, the models serving at this request). */
int attnd_handle_openapi(hreq *h) {
    int n = 0;
    attnd_version **vs = serving(h->srv, &n);
    char *body = vs ? attnd_openapi_doc(h->srv->api_key != NULL, vs, n, NULL) : NULL;
    unhold(vs, n);
    return owned(h, body);
}

/* GET /v2 */
int attnd_handle_v2(hreq *h) {
    return borrowed(h, h->srv->meta->v2);
}

/* GET /v2/models/{name} and /v2/models/{name}/versions/{version} */
int attnd_handle_v2_model(hreq *h) {
    attnd_version *v = path_model(h);
    if (!v) return -1;
    char *body = attnd_meta_v2_model(&v->info);
    attnd_version_unref(v);
    return owned(h, body);
}

/* GET /v2/models/{name}/ready and its versions/{version} form: 404 for a
 * model not serving (unknown, or unloaded), else readiness() of the
 * server. */
int attnd_handle_v2_model_ready(hreq *h) {
    attnd_version *v = path_model(h);
    if (!v) return -1;
    int rc = readiness(h, v->name, 0);
    attnd_version_unref(v);
    return rc;
}

/* GET /ui and /ui/{name}: the viewer's page and files (server/ui/),
 * without the key like /health (they hold no data); 404 with server.ui
 * off. The page starts with "<!doctype html>", never "<html>" (send.c). */
int attnd_handle_ui(hreq *h) {
    const attnd_ui_file *f = h->srv->cfg->ui ? attnd_ui_find(h->rm.name) : NULL;
    if (!f)
        return attnd_set_error(&h->err, AERR_NOT_FOUND, "no route %s %.100s", h->method, h->path);
    h->ui = f;
    h->ctype = f->type;
    if (attnd_ui_fresh(f, attnd_http_header(h, "If-None-Match")))
        attnd_reply_borrow(&h->r.reply, AOK_UNCHANGED, "", 0);
    else
        attnd_reply_borrow(&h->r.reply, AOK, f->data, f->len);
    return 0;
}

/* OPTIONS on a route's path, with CORS on (the preflight row): the
 * route's methods (Allow), and the preflight's headers when the origin is
 * allowed. */
int attnd_handle_preflight(hreq *h) {
    attnd_reply_borrow(&h->r.reply, AOK_PREFLIGHT, "", 0);
    return 0;
}

/* ---- routes that compute ---- */

/* Suspends the connection and queues the admitted job: the scheduler's
 * reply, or its refusal, goes out when it resumes. */
static int submit(hreq *h) {
    attnd_error e = {AOK, ""};
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(h->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    h->sock = ci ? ci->connect_fd : -1;
    /* suspend first: a fast worker may resume before we return */
    h->phase = P_WAIT;
    MHD_suspend_connection(h->conn);
    h->submitted = 1;
    if (attnd_sched_submit(h->srv->sched, &h->r, &e) < 0) {
        h->submitted = 0;
        attnd_reply_error(&h->r.reply, &e);
        MHD_resume_connection(h->conn);
    }
    return 0;
}

/* The Request-Timeout-Ms header, when given: a whole number of
 * milliseconds, 1 or more (past INT_MAX it is INT_MAX), into
 * h->r.asked_timeout_ms; 0, or -1 with the 400 naming the header. */
static int asked_timeout(hreq *h) {
    const char *v = attnd_http_header(h, "Request-Timeout-Ms");
    if (!v) return 0;
    long long ms = 0;
    size_t n = strspn(v, "0123456789");
    for (size_t i = 0; i < n && ms <= INT_MAX; i++)
        ms = ms * 10 + (v[i] - '0');
    if (n == 0 || v[n + strspn(v + n, " \t")] || ms < 1) /* trailing whitespace is not the value */
        return attnd_set_error(&h->err, AERR_BAD_REQUEST,
                               "Request-Timeout-Ms: expected a whole number of milliseconds, 1 or "
                               "more, got '%.40s'",
                               v);
    h->r.asked_timeout_ms = ms > INT_MAX ? INT_MAX : (int)ms;
    return 0;
}

/* The parsed job (rc: the parser's return) admitted, then queued; an open
 * without a prefix is answered at once. An open's id is X-Session-Id when
 * given, so that a load balancer hashing on that header keeps the
 * session's steps on this replica (docs/deploy.md). The body is let go
 * first: the job holds what the compute needs. */
static int admit(hreq *h, int rc) {
    attnd_http *s = h->srv;
    attnd_http_drop_body(h);
    if (rc < 0 || asked_timeout(h) < 0) return -1;
    if (h->r.job.ver) /* for its span */
        snprintf(h->model, sizeof h->model, "%s", h->r.job.ver->name);
    attnd_admit_env a = {s->sessions, s->env};
    rc = attnd_admit(&a, &h->r, attnd_http_header(h, "X-Session-Id"), attnd_mono_s(), &h->err,
                     &h->retry_after);
    if (rc < 0) return -1;
    return rc == 1 ? 0 : submit(h);
}

/* POST /v1/attention and /v1/models/{name}/attention */
int attnd_handle_attention(hreq *h) {
    const char *path_model = h->rm.name[0] ? h->rm.name : NULL;
    return admit(
        h, attnd_parse_native(h->srv->env, path_model, body_of(h), h->in.len, &h->r.job, &h->err));
}

/* POST /v2/models/{name}/infer and its versions/{version} form; the body
 * may carry the binary data extension (Inference-Header-Content-Length:
 * its JSON part's length); its parameters may open or step a session. */
int attnd_handle_v2_infer(hreq *h) {
    if (h->rm.version[0]) { /* {version}: the one serving, or 404 */
        attnd_version *v = path_model(h);
        if (!v) return -1;
        attnd_version_unref(v);
    }
    const char *hl = attnd_http_header(h, "Inference-Header-Content-Length");
    uint64_t json_len = 0;
    if (hl && (attnd_http_size(hl, (uint64_t)h->in.len, &json_len) < 0 || json_len == 0))
        return attnd_set_error(&h->err, AERR_BAD_REQUEST,
                               "Inference-Header-Content-Length: '%.40s' is not a size from 1 to "
                               "the body's length",
                               hl);
    return admit(h, attnd_parse_v2(h->srv->env, h->rm.name, body_of(h), h->in.len, (size_t)json_len,
                                   &h->r.job, &h->err));
}

/* 1 when the request's body is a session's state file: Content-Type
 * application/octet-stream (parameters allowed). */
static int state_body(hreq *h) {
    const char *ct = attnd_http_header(h, "Content-Type");
    size_t n = strlen("application/octet-stream");
    return ct && strncasecmp(ct, "application/octet-stream", n) == 0 &&
           (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

/* POST /v1/sessions with a state file: the session restored, its id
 * X-Session-Id's when given and free, else a new one; 201, the id in the
 * body and in the answer's X-Session-Id. */
static int restore(hreq *h) {
    attnd_http *s = h->srv;
    attnd_persist_env p = {s->sessions, s->env};
    attnd_restored r;
    int rc = attnd_session_restore(&p, (const unsigned char *)body_of(h), h->in.len,
                                   attnd_http_header(h, "X-Session-Id"), attnd_mono_s(), &r,
                                   &h->err, &h->retry_after);
    attnd_http_drop_body(h);
    if (rc < 0) return -1;
    snprintf(h->model, sizeof h->model, "%s", r.name);
    snprintf(h->r.step.id, sizeof h->r.step.id, "%s", r.id);
    size_t len = 0;
    char *body = attnd_write_open_answer(r.id, r.name, r.tokens, &len);
    if (!body) return attnd_set_error(&h->err, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&h->r.reply, AOK_CREATED, body, len, 0);
    return 0;
}

/* POST /v1/sessions: a native body whose query, the prefix, may be left
 * out; or a state file to restore. */
int attnd_handle_session_open(hreq *h) {
    if (state_body(h)) return restore(h);
    return admit(h,
                 attnd_parse_session_open(h->srv->env, body_of(h), h->in.len, &h->r.job, &h->err));
}

/* GET /v1/sessions/{id}/state: the session's state file. */
int attnd_handle_session_state(hreq *h) {
    attnd_persist_env p = {h->srv->sessions, h->srv->env};
    attnd_sbuf b;
    attnd_sb_init(&b);
    if (attnd_session_export(&p, h->rm.name, attnd_mono_s(), &b, &h->err) < 0) {
        attnd_sb_free(&b);
        return -1;
    }
    size_t len = 0;
    char *body = attnd_sb_take(&b, &len);
    if (!body) return attnd_set_error(&h->err, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&h->r.reply, AOK, body, len, 0);
    h->ctype = "application/octet-stream";
    return 0;
}

/* POST /v1/sessions/{id}/attention: the session's model reads the body. */
int attnd_handle_session_step(hreq *h) {
    const char *id = h->rm.name;
    attnd_version *v = attnd_session_model(h->srv->sessions, id, attnd_mono_s());
    if (!v) return attnd_session_refusal(SESS_NOT_FOUND, id, NULL, &h->err);
    int rc =
        attnd_parse_session_step(h->srv->env, v, id, body_of(h), h->in.len, &h->r.job, &h->err);
    attnd_version_unref(v);
    return admit(h, rc);
}

/* DELETE /v1/sessions/{id} */
int attnd_handle_session_delete(hreq *h) {
    attnd_session_status st = attnd_session_delete(h->srv->sessions, h->rm.name, attnd_mono_s());
    if (st != SESS_OK) return attnd_session_refusal(st, h->rm.name, NULL, &h->err);
    attnd_reply_borrow(&h->r.reply, AOK_NO_CONTENT, "", 0);
    return 0;
}
