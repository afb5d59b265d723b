/* http.c - libmicrohttpd glue: one access handler walks every request
 * through route -> auth -> body -> parse -> queue, and one send function
 * writes every answer with its headers (X-Request-Id, Server-Timing, CORS,
 * Allow, WWW-Authenticate, Retry-After). Errors take one road: an
 * attnd_error, its status from attnd_err_status(), its body from
 * attnd_error_body().
 *
 * A request that needs compute is parsed here, its connection suspended,
 * and it is handed to the scheduler; the worker that answers it resumes the
 * connection and the handler, called again, sends the answer it wrote.
 *
 * Also here: each connection's record in the guard (guard.c: read deadlines
 * and slots) follows its request's phase; request bodies are counted
 * against server.max_buffered_body_bytes as their bytes arrive; the drain
 * waits for admitted requests until server.drain_grace_s and reports the
 * ones it had to cut. libmicrohttpd's own error pages are replaced in
 * httperr.c.
 */
#include "http.h"

#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../config/splitmix.h"
#include "../core/sizes.h"
#include "buffer.h"
#include "clock.h"
#include "cpus.h"
#include "errors.h"
#include "guard.h"
#include "log.h"
#include "metrics.h"
#include "request.h"
#include "routes.h"
#include "sched.h"
#include "session.h"
#include "steps.h"

extern const char attnd_openapi_json[];
extern const size_t attnd_openapi_json_len;

enum { S_STARTING = 0, S_READY = 1, S_DRAINING = 2 };

struct attnd_server {
    const attnd_config *cfg; /* borrowed; outlives the server */
    attn_model *models;      /* (n_models) loaded weights, owned */
    attnd_model_info *info;  /* (n_models) */
    const char **names;      /* (n_models), borrowed from cfg */
    int n_models;
    attnd_parse_env env;
    attnd_sched *sched;
    attnd_sessions *sessions; /* KV-cache sessions (session.c), owned */
    attnd_guard *guard; /* connection slots and read deadlines */
    attnd_metrics metrics;
    struct MHD_Daemon *mhd;
    int port;
    char *api_key; /* NULL = no key needed; owned copy of the env value */
    size_t api_key_len;
    atomic_int state;   /* S_STARTING, S_READY, S_DRAINING */
    atomic_long active; /* requests between their first byte and completion */
    atomic_int past_deadline; /* 1: the drain deadline passed; answers now are cut */
    atomic_int cut;           /* requests cut short at the drain deadline */
    atomic_llong buffered;    /* request body bytes held now, over every connection */
    /* bodies built once at start-up */
    char *models_body;    /* GET /v1/models */
    char *v2_body;        /* GET /v2 */
    char **v2_model_body; /* (n_models) GET /v2/models/{name} */
    uint64_t id_seed;     /* request id generator */
    atomic_ullong id_next;
};

enum { P_HEADERS = 0, P_BODY, P_WAIT, P_SENT };

/* One HTTP request. Lives from the first handler call to the completion
 * callback and, when queued, until the scheduler lets go (refcounted in r). */
typedef struct {
    attnd_req r; /* first member: the scheduler's part */
    attnd_server *srv;
    struct MHD_Connection *conn;
    attnd_route_match rm; /* route, captures, Allow */
    attnd_route_id rid;   /* for metrics; R_UNKNOWN when no attnd_route */
    char method[12];
    char path[160];     /* for the access log, control characters replaced */
    char id[65];        /* X-Request-Id */
    const char *origin; /* allowed CORS origin to echo (MHD-owned header), or NULL */
    uint64_t t_recv_us; /* first handler call */
    int phase;          /* P_HEADERS, P_BODY, P_WAIT (suspended), P_SENT */
    attnd_error pre;    /* refusal decided before the body was read */
    attnd_sbuf in;            /* the body */
    long long in_held;  /* bytes of it counted in srv->buffered */
    int refuse_now;     /* 1: pre is answered before the body is read, then the
                           connection closes (413, 429 for the body budget) */
    long long in_total; /* body bytes received, kept or not */
    int submitted;      /* 1: handed to the scheduler */
    int status;         /* status sent, 0 before */
    attnd_err sent_err; /* error kind sent, AERR_NONE for 2xx */
    size_t sent_bytes;  /* body bytes of the answer */
    int late;           /* 1: its queued work was dropped at the drain deadline */
    guard_conn *gc;     /* its connection's record in the guard, or NULL */
    int retry_after;    /* Retry-After seconds of a 429, 0 = the default 1 */
} hreq;

/* ---- small helpers ---- */

/* Frees the body read so far and gives its bytes back to the budget. */
static void drop_body(hreq *h) {
    atomic_fetch_sub(&h->srv->buffered, h->in_held);
    h->in_held = 0;
    attnd_sb_free(&h->in);
}

/* Counts n more body bytes in the budget; 0 when they fit, -1 when not. */
static int budget_take(attnd_server *s, long long n) {
    if (atomic_fetch_add(&s->buffered, n) + n <= s->cfg->max_buffered_body_bytes) return 0;
    atomic_fetch_sub(&s->buffered, n);
    return -1;
}

static void hreq_free(attnd_req *r) {
    hreq *h = (hreq *)r;
    attnd_step_release(r->step, attnd_step_now()); /* a step that never computed */
    attnd_job_free(&r->job);
    free(r->body);
    drop_body(h);
    free(h);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A header's decimal size: digits only (no sign, no spaces), at most
 * limit. Returns 0, or -1 with *v untouched. */
static int parse_size(const char *s, uint64_t limit, uint64_t *v) {
    uint64_t r = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        if (sz_mul(r, 10, limit, &r) < 0 || sz_add(r, (uint64_t)(*s - '0'), limit, &r) < 0)
            return -1;
    }
    *v = r;
    return 0;
}

static int sane_id(const char *s) {
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (n >= 64) return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':'))
            return 0;
    }
    return n > 0;
}

static int key_ok(const attnd_server *s, const char *hdr) {
    if (!hdr || strncasecmp(hdr, "Bearer ", 7) != 0) return 0;
    const char *t = hdr + 7;
    while (*t == ' ')
        t++;
    size_t n = strlen(t);
    /* constant time in the key's length, whatever the client sent */
    unsigned char d = n != s->api_key_len;
    for (size_t i = 0; i < s->api_key_len; i++)
        d |= (unsigned char)(s->api_key[i] ^ (i < n ? t[i] : 0));
    return d == 0;
}

static const char *cors_origin(const attnd_server *s, struct MHD_Connection *c) {
    if (s->cfg->n_cors_origins == 0) return NULL;
    const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!o) return NULL;
    for (int i = 0; i < s->cfg->n_cors_origins; i++) {
        const char *a = s->cfg->cors_origins[i];
        if (strcmp(a, "*") == 0 || strcmp(a, o) == 0) return o;
    }
    return NULL;
}

static int is_compute(attnd_route_id id) {
    return id == R_ATTENTION || id == R_MODEL_ATTENTION || id == R_V2_INFER ||
           id == R_V2_VINFER || id == R_SESSIONS || id == R_SESSION_STEP;
}

/* ---- sending ---- */

/* Every answer goes through here. body is freed by MHD when must_free. */
static enum MHD_Result send_answer(hreq *h, int status, char *body, size_t len, int must_free,
                                   const char *ctype) {
    attnd_server *s = h->srv;
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, body, must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        if (must_free) free(body);
        return MHD_NO;
    }
    char timing[160];
    uint64_t now = attnd_mono_us();
    const attnd_req *r = &h->r;
    double q_ms = 0, c_ms = 0;
    if (r->t_admit_us) q_ms = (double)((r->t_start_us ? r->t_start_us : now) - r->t_admit_us) / 1e3;
    if (r->t_start_us) c_ms = (double)(r->t_end_us - r->t_start_us) / 1e3;
    snprintf(timing, sizeof(timing), "queue;dur=%.3f, compute;dur=%.3f, total;dur=%.3f", q_ms, c_ms,
             (double)(now - h->t_recv_us) / 1e3);
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(resp, "X-Request-Id", h->id);
    MHD_add_response_header(resp, "Server-Timing", timing);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    if (s->cfg->n_cors_origins > 0) MHD_add_response_header(resp, "Vary", "Origin");
    if (status == 200 && r->json_len) {
        char hl[32];
        snprintf(hl, sizeof(hl), "%zu", r->json_len);
        MHD_add_response_header(resp, "Inference-Header-Content-Length", hl);
    }
    if (h->origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", h->origin);
        MHD_add_response_header(resp, "Access-Control-Expose-Headers",
                                "X-Request-Id, Server-Timing, Retry-After");
    }
    if (status == 405 || (status == 204 && h->rm.route))
        MHD_add_response_header(resp, "Allow", h->rm.allow);
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"attnd\"");
    if (status == 429 || status == 503) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", status == 429 && h->retry_after > 0 ? h->retry_after : 1);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (atomic_load(&s->state) == S_DRAINING || h->refuse_now)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(h->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    h->status = status;
    h->sent_bytes = len;
    h->phase = P_SENT;
    return ret;
}

static enum MHD_Result send_json(hreq *h, int status, char *body, int must_free) {
    return send_answer(h, status, body, strlen(body), must_free, "application/json");
}

static enum MHD_Result send_error(hreq *h, const attnd_error *e) {
    size_t len = 0;
    char *body = attnd_error_body(e->msg, &len);
    if (!body) return MHD_NO;
    h->sent_err = e->code;
    return send_answer(h, attnd_err_status(e->code), body, len, 1, "application/json");
}

static enum MHD_Result send_err(hreq *h, attnd_err code, const char *fmt, const char *arg) {
    attnd_error e;
    e.code = code;
    snprintf(e.msg, sizeof(e.msg), fmt, arg);
    return send_error(h, &e);
}

/* ---- routes that answer at once ---- */

static enum MHD_Result answer_metrics(hreq *h) {
    attnd_server *s = h->srv;
    int *depth = calloc((size_t)s->n_models, sizeof(int));
    attnd_sbuf b;
    attnd_sb_init(&b);
    if (depth) attnd_sched_depths(s->sched, depth);
    attnd_metrics_write(&s->metrics, &b, s->names, depth ? depth : (int[1]){0}, depth ? s->n_models : 0);
    attnd_sched_metrics(s->sched, &b);
    attnd_steps_metrics(s->sessions, &b);
    free(depth);
    size_t len = 0;
    char *body = attnd_sb_take(&b, &len);
    if (!body) return send_err(h, AERR_INTERNAL, "%s", "out of memory");
    return send_answer(h, 200, body, len, 1, "text/plain; version=0.0.4; charset=utf-8");
}

/* GET routes; compute routes go to dispatch_compute. */
static enum MHD_Result dispatch_get(hreq *h) {
    attnd_server *s = h->srv;
    int state = atomic_load(&s->state);
    int mi = -1;
    if (h->rm.name[0]) {
        attnd_error e;
        mi = attnd_find_model(&s->env, h->rm.name, &e);
        if (mi < 0) return send_error(h, &e);
        if (h->rm.version[0] && strcmp(h->rm.version, "1") != 0)
            return send_err(h, AERR_NOT_FOUND,
                            "unknown model version '%s' (attnd serves version 1)", h->rm.version);
    }
    switch (h->rid) {
    case R_HEALTH:
        if (state != S_READY)
            return send_err(h, AERR_UNAVAILABLE, "%s",
                            state == S_DRAINING ? "draining" : "starting");
        return send_json(h, 200, "{\"status\":\"ok\"}\n", 0);
    /* the protocol's health answers: the status is the answer, the body
     * empty (docs/api.md, "Open Inference Protocol: MUST and SHOULD") */
    case R_V2_LIVE:
        return send_answer(h, 200, "", 0, 0, NULL);
    case R_V2_READY:
        if (state != S_READY)
            return send_err(h, AERR_UNAVAILABLE, "%s",
                            state == S_DRAINING ? "draining" : "starting");
        return send_answer(h, 200, "", 0, 0, NULL);
    case R_V1_MODELS:
        return send_json(h, 200, s->models_body, 0);
    case R_METRICS:
        return answer_metrics(h);
    case R_OPENAPI:
        return send_answer(h, 200, (char *)attnd_openapi_json, attnd_openapi_json_len, 0,
                           "application/json");
    case R_V2:
        return send_json(h, 200, s->v2_body, 0);
    case R_V2_MODEL:
    case R_V2_VMODEL:
        return send_json(h, 200, s->v2_model_body[mi], 0);
    case R_V2_MODEL_READY:
    case R_V2_VMODEL_READY:
        if (state != S_READY) return send_err(h, AERR_UNAVAILABLE, "%s", "draining");
        return send_answer(h, 200, "", 0, 0, NULL);
    default:
        break;
    }
    return send_err(h, AERR_INTERNAL, "%s", "no handler for this route");
}

/* Suspends the connection and queues the parsed job (tokens set). */
static enum MHD_Result submit(hreq *h) {
    attnd_error e = {AERR_NONE, ""};
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(h->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    h->r.sock = ci ? ci->connect_fd : -1;
    /* suspend first: a fast worker may resume before we return */
    h->phase = P_WAIT;
    MHD_suspend_connection(h->conn);
    h->submitted = 1;
    if (attnd_sched_submit(h->srv->sched, &h->r, &e) < 0) {
        h->submitted = 0;
        attnd_req_fail(&h->r, &e);
        MHD_resume_connection(h->conn);
    }
    return MHD_YES;
}

/* DELETE /v1/sessions/{id} */
static enum MHD_Result answer_delete(hreq *h) {
    attnd_server *s = h->srv;
    if (attnd_session_delete(s->sessions, h->rm.name, attnd_step_now()) != SESS_OK)
    {
        attnd_error e;
        attnd_set_error(&e, AERR_NOT_FOUND, "session '%.40s': %s", h->rm.name,
                        attnd_session_status_text(SESS_NOT_FOUND));
        return send_error(h, &e);
    }
    return send_answer(h, 204, "", 0, 0, NULL);
}

/* POST /v1/sessions and /v1/sessions/{id}/attention: the body becomes a
 * job and a begun step (steps.c), queued like any compute. */
static enum MHD_Result dispatch_session(hreq *h) {
    attnd_server *s = h->srv;
    attnd_error e = {AERR_NONE, ""};
    char opened[ATTND_SESSION_ID_LEN + 1];
    attnd_step_env se = {s->sessions, &s->env, s->cfg,
                         h->rid == R_SESSION_STEP ? h->rm.name : NULL,
                         h->rid == R_SESSIONS ? MHD_lookup_connection_value(
                                                    h->conn, MHD_HEADER_KIND, "X-Session-Id")
                                              : NULL,
                         attnd_step_now()};
    int rc = attnd_step_prepare(&se, h->in.p ? h->in.p : "", h->in.len, &h->r.job, &h->r.step,
                                opened, &e, &h->retry_after);
    drop_body(h);
    if (rc < 0) return send_error(h, &e);
    if (!h->r.step) { /* opened with no prefix: nothing to compute */
        size_t len = 0;
        char *body = attnd_step_open_answer(opened, s->names[h->r.job.model], &len);
        if (!body) return send_err(h, AERR_INTERNAL, "%s", "out of memory");
        return send_answer(h, 201, body, len, 1, "application/json");
    }
    h->r.tokens = h->r.job.L; /* the batch limit counts new rows (docs/api.md) */
    return submit(h);
}

/* A v2 infer whose parameters open a session (session_open) or step one
 * (session_id): the parsed job becomes a begun step (steps.c). An open
 * takes its id from X-Session-Id when given, as the native open does, so
 * that a load balancer hashing on that header keeps the session's steps on
 * this replica (docs/deploy.md); a step's header is not read (its id is in
 * the parameters). */
static enum MHD_Result v2_session(hreq *h) {
    attnd_server *s = h->srv;
    attnd_error e = {AERR_NONE, ""};
    attnd_job *job = &h->r.job;
    if (job->session_id && job->session_open)
        return send_err(h, AERR_BAD_REQUEST, "%s",
                        "parameters: give session_id (a step) or session_open, not both");
    const char *want_id =
        job->session_open
            ? MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "X-Session-Id")
            : NULL;
    attnd_step_env se = {s->sessions, &s->env, s->cfg, job->session_id, want_id,
                         attnd_step_now()};
    if (attnd_step_from_job(&se, job, &h->r.step, &e, &h->retry_after) < 0)
        return send_error(h, &e);
    h->r.tokens = job->L;
    return submit(h);
}

static enum MHD_Result dispatch_compute(hreq *h) {
    attnd_server *s = h->srv;
    attnd_error e = {AERR_NONE, ""};
    if (h->rid == R_SESSIONS || h->rid == R_SESSION_STEP) return dispatch_session(h);
    const char *path_model = h->rm.name[0] ? h->rm.name : NULL;
    if (h->rm.version[0] && strcmp(h->rm.version, "1") != 0)
        return send_err(h, AERR_NOT_FOUND, "unknown model version '%s' (attnd serves version 1)",
                        h->rm.version);
    const char *body = h->in.p ? h->in.p : "";
    int rc;
    if (h->rid == R_V2_INFER || h->rid == R_V2_VINFER) {
        /* the binary data extension: the JSON part's length */
        const char *hl = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND,
                                                     "Inference-Header-Content-Length");
        uint64_t json_len = 0;
        if (hl && (parse_size(hl, (uint64_t)h->in.len, &json_len) < 0 || json_len == 0))
            return send_err(h, AERR_BAD_REQUEST,
                            "Inference-Header-Content-Length: '%.40s' is not a size from 1 to the "
                            "body's length",
                            hl);
        rc = attnd_parse_v2(&s->env, path_model, body, h->in.len, (size_t)json_len, &h->r.job, &e);
        if (rc == 0 && (h->r.job.session_id || h->r.job.session_open)) {
            attnd_sb_free(&h->in);
            return v2_session(h);
        }
    } else {
        rc = attnd_parse_native(&s->env, path_model, body, h->in.len, &h->r.job, &e);
    }
    drop_body(h);
    if (rc < 0) return send_error(h, &e);
    h->r.tokens = attnd_job_tokens(&h->r.job);
    return submit(h);
}

/* The body is in (or there was none): answer or queue. */
static enum MHD_Result dispatch(hreq *h) {
    attnd_server *s = h->srv;
    if (h->pre.code != AERR_NONE) return send_error(h, &h->pre);
    if (strcmp(h->method, "OPTIONS") == 0) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        if (h->origin) {
            MHD_add_response_header(resp, "Access-Control-Allow-Origin", h->origin);
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", h->rm.allow);
            MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                    "Authorization, Content-Type, X-Request-Id");
            MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        }
        if (s->cfg->n_cors_origins > 0) MHD_add_response_header(resp, "Vary", "Origin");
        MHD_add_response_header(resp, "Allow", h->rm.allow);
        MHD_add_response_header(resp, "X-Request-Id", h->id);
        MHD_add_response_header(resp, "Server-Timing", "queue;dur=0, compute;dur=0, total;dur=0");
        enum MHD_Result ret = MHD_queue_response(h->conn, 204, resp);
        MHD_destroy_response(resp);
        h->status = 204;
        h->phase = P_SENT;
        return ret;
    }
    if (is_compute(h->rid)) return dispatch_compute(h);
    if (h->rid == R_SESSION) return answer_delete(h);
    return dispatch_get(h);
}

/* What a body declared or sent at the start holds in memory at most before
 * more of it has arrived, bytes. */
#define BODY_RESERVE_MAX (64 << 10)

/* The model an attention request is for, when its header lines tell (the
 * path names it, or only one is served); -1 when only its body can. */
static int target_model(const attnd_server *s, const hreq *h) {
    if (h->rid == R_MODEL_ATTENTION || h->rid == R_V2_INFER || h->rid == R_V2_VINFER) {
        attnd_error later; /* an unknown model is refused once the body is read */
        return attnd_find_model(&s->env, h->rm.name, &later);
    }
    return h->rid == R_ATTENTION && s->n_models == 1 ? 0 : -1;
}

/* 1 when the request's model is known and its queue is full now: the 429 it
 * would get after parsing goes out before its body is read or decoded. The
 * scheduler checks again at admission. */
static int queue_full(attnd_server *s, const hreq *h) {
    int mi = target_model(s, h);
    if (mi < 0) return 0;
    int *depth = calloc((size_t)s->n_models, sizeof(int));
    if (!depth) return 0;
    attnd_sched_depths(s->sched, depth);
    int full = depth[mi] >= s->cfg->max_queue_requests;
    free(depth);
    return full;
}

/* 429: the bodies held over every connection would pass
 * server.max_buffered_body_bytes (docs/config.md, "Memory"). */
static void budget_refusal(hreq *h, long long n) {
    attnd_set_error(&h->pre, AERR_QUEUE_FULL,
                    "%lld more body bytes would pass the server's limit on request bodies held at "
                    "once (server.max_buffered_body_bytes, %lld); retry later",
                    n, h->srv->cfg->max_buffered_body_bytes);
}

/* First call: route, method, key, draining, a full queue, declared body
 * size. 413 and 429 (queue full, body budget) go out at once, before the
 * body is read, and close the connection; other refusals wait for the body
 * so the connection stays usable. */
static void examine(hreq *h, const char *url) {
    attnd_server *s = h->srv;
    struct MHD_Connection *c = h->conn;
    attnd_route_find(h->method, url, s->cfg->n_cors_origins > 0, &h->rm);
    h->rid = h->rm.route ? h->rm.route->id : R_UNKNOWN;
    h->origin = cors_origin(s, c);
    if (h->rm.status == 404) {
        attnd_set_error(&h->pre, AERR_NOT_FOUND, "no route %s %.100s", h->method, h->path);
        return;
    }
    if (h->rm.status == 405) {
        attnd_set_error(&h->pre, AERR_METHOD, "%s is not allowed on %.100s (allowed: %s)",
                        h->method, h->path, h->rm.allow);
        return;
    }
    if (strcmp(h->method, "OPTIONS") == 0) return; /* preflights carry no credentials */
    if (s->api_key && !h->rm.route->open &&
        !key_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        attnd_set_error(&h->pre, AERR_UNAUTHORIZED,
                        "missing or wrong API key: send Authorization: Bearer <key>");
        return;
    }
    if (is_compute(h->rid) && atomic_load(&s->state) != S_READY) {
        attnd_set_error(&h->pre, AERR_UNAVAILABLE, "the server is draining");
        return;
    }
    if (queue_full(s, h)) {
        attnd_set_error(&h->pre, AERR_QUEUE_FULL,
                        "the queue of model '%s' is full (%d requests); retry later",
                        s->names[target_model(s, h)], s->cfg->max_queue_requests);
        h->refuse_now = 1;
        return;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
        /* libmicrohttpd refuses what is not a number of bytes; past max_body_bytes the
         * exact number does not matter, only that it is too many */
        uint64_t v;
        if (parse_size(cl, (uint64_t)s->cfg->max_body_bytes, &v) < 0) {
            if (strspn(cl, "0123456789") == strlen(cl) && cl[0])
                attnd_set_error(&h->pre, AERR_TOO_LARGE,
                                "body of %.40s bytes, the limit is %lld", cl,
                                s->cfg->max_body_bytes);
            else
                attnd_set_error(&h->pre, AERR_BAD_REQUEST,
                                "Content-Length: '%.40s' is not a decimal number of bytes", cl);
            h->refuse_now = 1;
            return;
        }
        long long n = (long long)v; /* at most max_body_bytes (2^34) */
        long long room = s->cfg->max_buffered_body_bytes - atomic_load(&s->buffered);
        if (n > room && is_compute(h->rid)) {
            budget_refusal(h, n);
            h->refuse_now = 1;
        } else if (n > 0 && is_compute(h->rid)) {
            /* a declaration reserves nothing: memory follows the bytes that arrive */
            /* room for n bytes and the NUL: at most BODY_RESERVE_MAX (attnd_sbuf rounds to a
             * power of two, so n + 1 past it would double the reserve) */
            attnd_sb_reserve(&h->in, (size_t)(n < BODY_RESERVE_MAX ? n : BODY_RESERVE_MAX - 1));
        }
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    attnd_server *s = cls;
    hreq *h = *con_cls;
    if (!h) {
        h = calloc(1, sizeof(*h));
        if (!h) return MHD_NO;
        atomic_init(&h->r.refs, 1);
        h->r.free_fn = hreq_free;
        h->r.sock = -1;
        h->srv = s;
        h->conn = conn;
        h->t_recv_us = attnd_mono_us();
        snprintf(h->method, sizeof(h->method), "%s", method);
        snprintf(h->path, sizeof(h->path), "%s", url);
        for (char *p = h->path; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == ' ' || *p == 0x7f) *p = '?';
        const char *rid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
        if (rid && sane_id(rid)) {
            snprintf(h->id, sizeof(h->id), "%s", rid);
        } else {
            uint64_t n = s->id_seed ^ atomic_fetch_add(&s->id_next, 1);
            snprintf(h->id, sizeof(h->id), "%016llx", (unsigned long long)attnd_splitmix64(&n));
        }
        *con_cls = h;
        atomic_fetch_add(&s->active, 1);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        h->gc = ci ? ci->socket_context : NULL;
        examine(h, url);
        /* 413 or 429 now, before the body is read */
        if (h->refuse_now) {
            attnd_guard_phase(s->guard, h->gc, GUARD_BUSY);
            return send_error(h, &h->pre);
        }
        attnd_guard_phase(s->guard, h->gc, GUARD_BODY);
        h->phase = P_BODY;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        h->in_total += (long long)n;
        if (h->phase != P_BODY) return MHD_YES;
        if (h->pre.code == AERR_NONE) {
            if ((long long)(h->in.len + n) > s->cfg->max_body_bytes) {
                attnd_set_error(&h->pre, AERR_TOO_LARGE, "body over the limit of %lld bytes",
                                s->cfg->max_body_bytes);
                drop_body(h);
            } else if (budget_take(s, (long long)n) < 0) {
                budget_refusal(h, (long long)n);
                drop_body(h);
            } else {
                h->in_held += (long long)n;
                attnd_sb_put(&h->in, upload_data, n);
                if (h->in.oom) {
                    attnd_set_error(&h->pre, AERR_INTERNAL, "out of memory reading the body");
                    drop_body(h);
                }
            }
        }
        /* a refused body is read and dropped, but not without end */
        if (h->pre.code != AERR_NONE && h->in_total > 2 * s->cfg->max_body_bytes + (1 << 20))
            return MHD_NO;
        return MHD_YES;
    }
    if (h->phase == P_WAIT) { /* resumed: the scheduler answered */
        if (h->r.gone) return MHD_NO;
        h->sent_err = h->r.err;
        /* queued work dropped at the drain deadline: a refusal, not its answer */
        if (atomic_load(&s->past_deadline) && h->r.err == AERR_UNAVAILABLE) h->late = 1;
        char *body = h->r.body;
        h->r.body = NULL;
        if (!body) return MHD_NO;
        return send_answer(h, h->r.status, body, h->r.body_len, 1,
                           h->r.json_len ? "application/octet-stream" : "application/json");
    }
    if (h->phase == P_SENT) return MHD_YES;
    attnd_guard_phase(s->guard, h->gc, GUARD_BUSY); /* the whole request is in */
    return dispatch(h);
}

/* How a request ended, for the access log's end= field: "ok" only when its
 * whole answer went out. */
static const char *end_word(const hreq *h, enum MHD_RequestTerminationCode toe) {
    const char *cut = attnd_guard_cut(h->srv->guard, h->gc);
    if (cut) return cut;
    if (h->late || toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN) return "drain_deadline";
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && h->status) return "ok";
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) return "idle_timeout";
    if (toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT || toe == MHD_REQUEST_TERMINATED_READ_ERROR ||
        h->r.gone || !h->status)
        return "client_gone";
    return "error";
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    attnd_server *s = cls;
    hreq *h = *con_cls;
    if (!h) return;
    *con_cls = NULL;
    if (h->submitted) attnd_sched_cancel(s->sched, &h->r);
    uint64_t now = attnd_mono_us();
    int status = h->status;
    const char *end = end_word(h, toe);
    if (strcmp(end, "drain_deadline") == 0) {
        atomic_fetch_add(&s->cut, 1);
        attnd_log(LOG_WARN,
                  "request %s %s %s cut short at the drain deadline (%d s): its answer was not "
                  "delivered whole",
                  h->id, h->method, h->path, s->cfg->drain_grace_s);
    } else if (status == 0 && strcmp(end, "client_gone") != 0) {
        status = 408; /* the guard closed it: too slow, or evicted (never sent) */
        attnd_metrics_disconnect(&s->metrics);
    } else if (status == 0 || h->r.gone) { /* the client left before the answer */
        status = 499;
        attnd_metrics_disconnect(&s->metrics);
    } else if (h->sent_err != AERR_NONE) {
        attnd_metrics_reject(&s->metrics, h->sent_err);
    }
    attnd_metrics_request(&s->metrics, h->rid, status, now - h->t_recv_us);
    attnd_access a = {h->method, h->path, status, h->sent_bytes,
                      (double)(now - h->t_recv_us) / 1e3, h->r.batch_requests, h->id, end};
    attnd_log_access(&a); /* nothing secret: no headers, no body */
    /* a kept-alive connection now waits for its next request's header lines */
    attnd_guard_phase(s->guard, h->gc, GUARD_HEADER);
    atomic_fetch_sub(&s->active, 1);
    attnd_req_unref(&h->r);
}

/* Connection start and end: the guard's records. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    attnd_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? attnd_guard_open(s->guard, ci->connect_fd) : NULL;
    } else {
        attnd_guard_close(s->guard, *socket_context);
        *socket_context = NULL;
    }
}

/* ---- finish callback from the scheduler (worker or sweeper thread) ---- */

static void on_answer_ready(attnd_req *r, void *arg) {
    (void)arg;
    hreq *h = (hreq *)r;
    MHD_resume_connection(h->conn);
}

/* Percent-decoding of the path (and query arguments), in place, except
 * %00: a NUL would cut the path short and route "/a%00/b" as "/a". */
static size_t unescape(void *cls, struct MHD_Connection *c, char *uri) {
    (void)cls;
    (void)c;
    char *w = uri;
    for (const char *r = uri; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi << 4 | lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - uri);
}

/* ---- start-up ---- */

static char *dump(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    return t;
}

/* A model's rotary positions as its config gives them. */
static json_t *rope_json(const attn_rope *r) {
    json_t *j = json_pack("{s:f, s:i, s:s}", "theta", r->theta, "dim", r->dim, "style",
                          r->style == ATTN_ROPE_INTERLEAVED ? "interleaved" : "half");
    if (r->scaling == ATTN_ROPE_SCALE_LINEAR)
        json_object_set_new(j, "scaling", json_pack("{s:s, s:f}", "type", "linear", "factor",
                                                    r->factor));
    if (r->scaling == ATTN_ROPE_SCALE_LLAMA3)
        json_object_set_new(
            j, "scaling",
            json_pack("{s:s, s:f, s:f, s:f, s:i}", "type", "llama3", "factor", r->factor,
                      "low_freq_factor", r->low_freq_factor, "high_freq_factor",
                      r->high_freq_factor, "original_max_position_embeddings",
                      r->original_max_position));
    return j;
}

/* One tensor of the v2 model metadata: rank dimensions, variable (-1)
 * but the last, which is width when width > 0. */
static json_t *v2_tensor(const char *name, const char *datatype, int rank, int width) {
    json_t *shape = json_array();
    for (int d = 0; d < rank; d++)
        json_array_append_new(shape, json_integer(d == rank - 1 && width > 0 ? width : -1));
    return json_pack("{s:s, s:s, s:o}", "name", name, "datatype", datatype, "shape", shape);
}

/* GET /v2/models/{name}: the inputs this model accepts and the outputs it
 * gives (docs/api.md). A model with rotary positions takes positions and no
 * key or value (a key row would have no position); the others the reverse.
 * The platform follows the protocol's "<project>_<format>": the weights'
 * format, a safetensors file or the embedded default. */
static json_t *v2_model_json(const char *name, const attn_hparams *hp, int from_file) {
    json_t *in = json_array();
    json_array_append_new(in, v2_tensor("query", "FP32", 3, hp->embed_dim));
    if (!hp->rope.dim) {
        json_array_append_new(in, v2_tensor("key", "FP32", 3, hp->kdim));
        json_array_append_new(in, v2_tensor("value", "FP32", 3, hp->vdim));
    }
    json_array_append_new(in, v2_tensor("key_padding_mask", "BOOL", 2, 0));
    json_array_append_new(in, v2_tensor("attn_mask", "BOOL", 3, 0));
    if (hp->rope.dim) json_array_append_new(in, v2_tensor("positions", "INT64", 2, 0));
    return json_pack("{s:s, s:[s], s:s, s:o, s:[o, o]}", "name", name, "versions", "1", "platform",
                     from_file ? "attnd_safetensors" : "attnd_embedded", "inputs", in, "outputs", v2_tensor("output", "FP32", 3, hp->embed_dim),
                     v2_tensor("attention", "FP32", 4, 0));
}

static int build_bodies(attnd_server *s) {
    const attnd_config *c = s->cfg;
    json_t *models = json_array();
    for (int i = 0; i < s->n_models; i++) {
        const attn_hparams *hp = &s->info[i].hp; /* filled in by attn_model_init */
        json_t *m = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:b, s:b, s:s}", "name",
                              s->names[i], "embed_dim", hp->embed_dim, "num_heads", hp->num_heads,
                              "num_kv_heads", hp->num_kv_heads, "head_dim", hp->head_dim, "kdim",
                              hp->kdim, "vdim", hp->vdim, "scale", hp->scale, "bias", hp->bias,
                              "causal", hp->causal, "weights",
                              c->models[i].weights ? "safetensors" : "embedded");
        if (hp->rope.dim) json_object_set_new(m, "rope", rope_json(&hp->rope));
        if (c->models[i].max_positions)
            json_object_set_new(m, "max_positions", json_integer(c->models[i].max_positions));
        json_array_append_new(models, m);
    }
    const attn_blas_info *blas = attn_blas_get_info();
    attnd_cpus cpus;
    attnd_cpus_count(&cpus);
    json_t *root = json_pack(
        "{s:o, s:{s:I, s:I, s:I, s:i}, s:{s:i, s:i, s:i, s:i}, s:{s:i}, s:{s:i, s:i, s:i, s:s, s:b, "
        "s:s}}",
        "models", models, "limits", "max_body_bytes", (json_int_t)c->max_body_bytes,
        "max_tokens_per_request", (json_int_t)c->max_tokens_per_request, "max_attention_floats",
        (json_int_t)c->max_attention_floats, "request_timeout_ms", c->request_timeout_ms,
        "batching", "max_batch_tokens", c->max_batch_tokens, "max_batch_requests",
        c->max_batch_requests, "max_queue_delay_us", c->max_queue_delay_us, "max_queue_requests",
        c->max_queue_requests, "workers", "threads", c->worker_threads, "compute", "threads",
        c->worker_threads, "cpus", cpus.n, "http_threads", c->http_threads, "blas_core",
        blas ? blas->core : "none", "blas_core_from_env",
        blas && blas->by_user, "cpu_features", blas ? blas->features : "");
    json_t *lim = json_object_get(root, "limits");
    json_object_set_new(lim, "max_sessions", json_integer(c->max_sessions));
    json_object_set_new(lim, "max_session_bytes", json_integer(c->max_session_bytes));
    json_object_set_new(lim, "max_session_bytes_each", json_integer(c->max_session_bytes_each));
    json_object_set_new(lim, "session_idle_s", json_integer(c->session_idle_s));
    s->models_body = dump(root);
    s->v2_body = dump(json_pack("{s:s, s:s, s:[s], s:s, s:s}", "name", "attnd", "version",
                                ATTND_VERSION, "extensions", "binary_tensor_data", "blas_core",
                                blas ? blas->core : "none", "cpu_features",
                                blas ? blas->features : ""));
    s->v2_model_body = calloc((size_t)s->n_models, sizeof(char *));
    if (!s->models_body || !s->v2_body || !s->v2_model_body) return -1;
    for (int i = 0; i < s->n_models; i++)
        if (!(s->v2_model_body[i] =
                  dump(v2_model_json(s->names[i], &s->info[i].hp, c->models[i].weights != NULL))))
            return -1;
    return 0;
}

static int load_models(attnd_server *s, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    s->n_models = c->n_models;
    s->models = calloc((size_t)c->n_models, sizeof(attn_model));
    s->info = calloc((size_t)c->n_models, sizeof(attnd_model_info));
    s->names = calloc((size_t)c->n_models, sizeof(char *));
    if (!s->models || !s->info || !s->names) {
        snprintf(err, errlen, "out of memory loading models");
        return -1;
    }
    for (int i = 0; i < c->n_models; i++) {
        const attnd_model_config *mc = &c->models[i];
        if (attnd_model_load(&s->models[i], mc, err, errlen) < 0) return -1;
        s->names[i] = mc->name;
        s->info[i].name = mc->name;
        s->info[i].hp = s->models[i].hp;
        s->info[i].max_positions = mc->max_positions;
        const attn_hparams *hp = &s->models[i].hp;
        attnd_log(LOG_INFO,
                  "model %s: embed_dim=%d num_heads=%d kdim=%d vdim=%d bias=%s causal=%s weights=%s",
                  mc->name, hp->embed_dim, hp->num_heads, hp->kdim, hp->vdim,
               hp->bias ? "true" : "false", hp->causal ? "true" : "false",
               mc->weights ? mc->weights : "embedded default (fixed seed)");
    }
    s->env.models = s->info;
    s->env.n_models = s->n_models;
    s->env.max_tokens_per_request = c->max_tokens_per_request;
    s->env.max_attention_floats = c->max_attention_floats;
    return 0;
}

/* libmicrohttpd's own messages, as warnings of the one log. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    attnd_log(LOG_WARN, "http: %s", msg);
}

static int start_mhd(attnd_server *s, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof(port), "%d", c->port);
    int gai = getaddrinfo(c->host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", c->host, gai_strerror(gai));
        return -1;
    }
    /* poll(2), not epoll: libmicrohttpd 0.9.75 registers sockets with epoll
     * edge-triggered and stops reading after a short read, so a client that
     * sends part of a request and closes at once is never seen to close and
     * holds its slot until the idle timeout (docs/config.md, "Connections"). */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)c->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)c->http_threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)c->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)c->connection_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%d (address in use, or not allowed)", c->host,
                 c->port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : c->port;
    return 0;
}

attnd_server *attnd_server_new(const attnd_config *cfg, attnd_exit *why, char *err,
                               size_t errlen) {
    *why = ATTND_EXIT_INTERNAL;
    attnd_server *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->cfg = cfg;
    attnd_metrics_init(&s->metrics);
    atomic_init(&s->state, S_STARTING);
    atomic_init(&s->active, 0);
    atomic_init(&s->past_deadline, 0);
    atomic_init(&s->cut, 0);
    atomic_init(&s->buffered, 0);
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) seed = attnd_mono_us();
    s->id_seed = seed;
    atomic_init(&s->id_next, 0);
    const char *key = cfg->api_key_env && cfg->api_key_env[0] ? getenv(cfg->api_key_env) : NULL;
    if (key && key[0]) {
        s->api_key = strdup(key);
        s->api_key_len = strlen(key);
        if (!s->api_key) goto oom;
    }
    if (load_models(s, err, errlen) < 0) {
        *why = ATTND_EXIT_WEIGHTS;
        goto fail;
    }
    if (build_bodies(s) < 0) goto oom;
    attnd_session_limits sl = {cfg->max_sessions, cfg->max_session_bytes,
                               cfg->max_session_bytes_each, cfg->session_idle_s};
    s->sessions = attnd_sessions_new(&sl);
    if (!s->sessions || attnd_sessions_reaper_start(s->sessions, attnd_step_now) < 0) goto oom;
    attnd_sched_opts o = {cfg, s->models, s->info, s->n_models, &s->metrics, on_answer_ready, s};
    s->sched = attnd_sched_new(&o, err, errlen);
    if (!s->sched) goto fail;
    s->guard = attnd_guard_new(cfg->max_connections, cfg->header_timeout_ms, cfg->body_timeout_ms,
                               err, errlen);
    if (!s->guard) goto fail;
    if (start_mhd(s, err, errlen) < 0) {
        *why = ATTND_EXIT_LISTEN;
        goto fail;
    }
    attnd_log(LOG_INFO, "api key: %s; cors: %s", s->api_key ? "required" : "none",
              cfg->n_cors_origins ? "on" : "off");
    atomic_store(&s->state, S_READY);
    return s;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    attnd_server_free(s);
    return NULL;
}

int attnd_server_port(const attnd_server *s) {
    return s->port;
}

static int idle(attnd_server *s) {
    return atomic_load(&s->active) == 0 && (!s->sched || attnd_sched_pending(s->sched) == 0);
}

int attnd_server_drain(attnd_server *s) {
    atomic_store(&s->state, S_DRAINING);
    if (s->mhd) {
        MHD_socket ls = MHD_quiesce_daemon(s->mhd);
        if (ls != MHD_INVALID_SOCKET) close(ls);
    }
    if (s->sched) attnd_sched_drain(s->sched);
    uint64_t limit = attnd_mono_us() + (uint64_t)s->cfg->drain_grace_s * 1000000u;
    while (attnd_mono_us() < limit && !idle(s))
        usleep(2000);
    if (!idle(s)) {
        /* what is answered from here on is cut: queued work gets 503 now,
         * running batches finish, and stopping the daemon closes every
         * connection still sending (each logged by on_completed) */
        atomic_store(&s->past_deadline, 1);
        attnd_log(LOG_WARN, "drain deadline of %d s passed with %ld request%s unfinished",
               s->cfg->drain_grace_s, atomic_load(&s->active),
               atomic_load(&s->active) == 1 ? "" : "s");
        if (s->sched) attnd_sched_abort_queued(s->sched);
    }
    /* suspended connections must all be resumed before MHD stops */
    attnd_sched_stop(s->sched);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    return atomic_load(&s->cut);
}

void attnd_server_free(attnd_server *s) {
    if (!s) return;
    atomic_store(&s->state, S_DRAINING);
    attnd_sched_stop(s->sched);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    attnd_guard_free(s->guard); /* after the daemon: it closed every connection */
    attnd_sched_free(s->sched);
    attnd_sessions_free(s->sessions); /* after the daemon: no request holds a step */
    for (int i = 0; i < s->n_models; i++)
        attn_model_free(&s->models[i]);
    free(s->models);
    free(s->info);
    free(s->names);
    free(s->models_body);
    free(s->v2_body);
    for (int i = 0; i < s->n_models; i++) {
        if (s->v2_model_body) free(s->v2_model_body[i]);
    }
    free(s->v2_model_body);
    free(s->api_key);
    free(s);
}
