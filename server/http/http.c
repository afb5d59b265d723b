/* http.c - libmicrohttpd glue: one access handler walks every request
 * through route -> auth -> body -> handler, and one function, send_reply,
 * sends every answer, the CORS preflight included: the request's reply
 * (errors.h), the status and the headers its kind asks for (Allow,
 * WWW-Authenticate, Retry-After), and those every answer carries
 * (X-Request-Id, Server-Timing, CORS). A refusal is an attnd_error in the
 * request, made into its reply by attnd_reply_error.
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
#include <poll.h>
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

#include "../../config/splitmix.h"
#include "../../core/sizes.h"
#include "../base/buffer.h"
#include "../base/clock.h"
#include "../base/cpus.h"
#include "../base/reply.h"
#include "../batch/sched.h"
#include "../batch/session.h"
#include "../batch/steps.h"
#include "../body/request.h"
#include "../obs/log.h"
#include "../obs/metrics.h"
#include "guard.h"
#include "routes.h"
#include "../ui/ui.h"

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
    attnd_guard *guard;       /* connection slots and read deadlines */
    attnd_metrics metrics;
    struct MHD_Daemon *mhd;
    int port;
    char *api_key; /* NULL = no key needed; owned copy of the env value */
    size_t api_key_len;
    atomic_int state;         /* S_STARTING, S_READY, S_DRAINING */
    atomic_long active;       /* requests between their first byte and completion */
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

/* One HTTP request: the scheduler's job (r) and what the HTTP side keeps
 * for it. Lives from the first handler call to the completion callback
 * and, when queued, until the scheduler lets go (refcounted in r). */
typedef struct attnd_http_req {
    attnd_req r; /* first member: the job, its times and its reply */
    attnd_server *srv;
    struct MHD_Connection *conn;
    attnd_route_match rm; /* route, captures, Allow */
    attnd_route_id rid;   /* for metrics; R_UNKNOWN when no route */
    char method[12];
    char path[160];     /* for the access log, control characters replaced */
    char id[65];        /* X-Request-Id */
    const char *origin; /* allowed CORS origin to echo (MHD-owned header), or NULL */
    uint64_t t_recv_us; /* first handler call */
    int phase;          /* P_HEADERS, P_BODY, P_WAIT (suspended), P_SENT */
    attnd_error err;    /* its refusal, decided before the body was read or by its
                           handler; AOK while there is none */
    attnd_sbuf in;      /* the body */
    long long in_held;  /* bytes of it counted in srv->buffered */
    int refuse_now;     /* 1: err is answered before the body is read, then the
                           connection closes (413, 429 for the body budget) */
    long long in_total; /* body bytes received, kept or not */
    int submitted;      /* 1: handed to the scheduler */
    int sock;           /* client socket while queued (asked whether the client left), or -1 */
    int gone;           /* 1: its client left while queued: close, do not answer */
    const char *ctype;  /* Content-Type of a success that is not JSON (metrics), or NULL */
    int status;         /* status sent, 0 before */
    attnd_kind sent;    /* kind of the answer sent */
    size_t sent_bytes;  /* body bytes of the answer */
    int late;           /* 1: its queued work was dropped at the drain deadline */
    guard_conn *gc;     /* its connection's record in the guard, or NULL */
    int retry_after;    /* Retry-After seconds of a 429, 0 = the default 1 */
    /* the viewer's file it answers (ui.c: its own headers), or NULL */
    const attnd_ui_file *ui;
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
    attnd_reply_free(&r->reply);
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

/* 1 when h's route has flag (routes.c); none for a path no route matches. */
static int route_has(const hreq *h, unsigned flag) {
    return h->rm.route && (h->rm.route->flags & flag);
}

/* ---- sending: the one road every answer takes ---- */

/* Server-Timing: the request's queue, compute and total milliseconds. */
static void timing_text(const hreq *h, uint64_t now, char *buf, size_t cap) {
    const attnd_req *r = &h->r;
    double q_ms = 0, c_ms = 0;
    if (r->t_admit_us) q_ms = (double)((r->t_start_us ? r->t_start_us : now) - r->t_admit_us) / 1e3;
    if (r->t_start_us) c_ms = (double)(r->t_end_us - r->t_start_us) / 1e3;
    snprintf(buf, cap, "queue;dur=%.3f, compute;dur=%.3f, total;dur=%.3f", q_ms, c_ms,
             (double)(now - h->t_recv_us) / 1e3);
}

/* The body's type: none for an empty body (the v2 health answers, 204s),
 * JSON for a refusal, binary after JSON for v2 binary outputs, else what
 * the handler said (JSON unless it said otherwise). */
static const char *content_type(const hreq *h) {
    const attnd_reply *a = &h->r.reply;
    if (!a->len) return NULL;
    if (attnd_kind_is_error(a->kind)) return "application/json";
    if (a->json_len) return "application/octet-stream";
    return h->ctype ? h->ctype : "application/json";
}

/* The CORS headers for an allowed origin: a preflight's answer, or what
 * the page may read of any other. */
static void add_cors(struct MHD_Response *resp, const hreq *h, int preflight) {
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", h->origin);
    if (!preflight) {
        MHD_add_response_header(resp, "Access-Control-Expose-Headers",
                                "X-Request-Id, Server-Timing, Retry-After");
        return;
    }
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", h->rm.allow);
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, X-Request-Id");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
}

/* The headers every answer carries, and those its kind asks for. */
static void add_headers(struct MHD_Response *resp, const hreq *h, unsigned hd) {
    attnd_server *s = h->srv;
    const attnd_reply *a = &h->r.reply;
    int preflight = (hd & ATTND_HDR_PREFLIGHT) != 0;
    char timing[160], n[32];
    const char *ctype = content_type(h);
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(resp, "X-Request-Id", h->id);
    if (preflight)
        snprintf(timing, sizeof timing, "queue;dur=0, compute;dur=0, total;dur=0");
    else
        timing_text(h, attnd_mono_us(), timing, sizeof timing);
    MHD_add_response_header(resp, "Server-Timing", timing);
    const char *hn, *hv;
    for (int i = 0; h->ui && attnd_ui_header(h->ui, i, &hn, &hv); i++)
        MHD_add_response_header(resp, hn, hv); /* its caching and its page's policy */
    if (!preflight && !h->ui) MHD_add_response_header(resp, "Cache-Control", "no-store");
    if (s->cfg->n_cors_origins > 0) MHD_add_response_header(resp, "Vary", "Origin");
    if (a->kind == AOK && a->json_len) {
        snprintf(n, sizeof n, "%zu", a->json_len);
        MHD_add_response_header(resp, "Inference-Header-Content-Length", n);
    }
    if (h->origin) add_cors(resp, h, preflight);
    if (hd & ATTND_HDR_ALLOW) MHD_add_response_header(resp, "Allow", h->rm.allow);
    if (hd & ATTND_HDR_AUTHENTICATE)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"attnd\"");
    if (hd & ATTND_HDR_RETRY_AFTER) {
        snprintf(n, sizeof n, "%d", h->retry_after > 0 ? h->retry_after : 1);
        MHD_add_response_header(resp, "Retry-After", n);
    }
    if (!preflight && (atomic_load(&s->state) == S_DRAINING || h->refuse_now))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

/* Every answer leaves here, the CORS preflight included: h->r.reply, with
 * the status of its kind (errors.c) and the headers above. */
static enum MHD_Result send_reply(hreq *h) {
    attnd_reply *a = &h->r.reply;
    unsigned hd = attnd_kind_headers(a->kind);
    int status = attnd_kind_status(a->kind), borrowed = a->borrowed;
    size_t len = a->len;
    char *body = attnd_reply_take(a);
    if (!body) return MHD_NO; /* out of memory writing it */
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, body, borrowed ? MHD_RESPMEM_PERSISTENT : MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        if (!borrowed) free(body);
        return MHD_NO;
    }
    add_headers(resp, h, hd);
    enum MHD_Result ret = MHD_queue_response(h->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    h->status = status;
    h->sent = a->kind;
    h->sent_bytes = len;
    h->phase = P_SENT;
    return ret;
}

/* ---- the route handlers: each answers into h->r.reply (or queues the
 * request) and returns 0, or returns -1 with h->err set ---- */

/* A v2 route's {name} and {version}: the model's index, or -1 with the 404
 * of an unknown model or version. */
static int path_model(hreq *h) {
    int mi = attnd_find_model(&h->srv->env, h->rm.name, &h->err);
    if (mi < 0) return -1;
    if (h->rm.version[0] && strcmp(h->rm.version, "1") != 0)
        return attnd_set_error(&h->err, AERR_NOT_FOUND,
                               "unknown model version '%s' (attnd serves version 1)",
                               h->rm.version);
    return mi;
}

/* 503 unless the server is ready: "draining", or "starting" where the
 * route tells the two apart. */
static int ready(hreq *h, int says_starting) {
    int state = atomic_load(&h->srv->state);
    if (state == S_READY) return 0;
    return attnd_set_error(&h->err, AERR_UNAVAILABLE, "%s",
                           state == S_STARTING && says_starting ? "starting" : "draining");
}

/* GET /health */
int attnd_handle_health(hreq *h) {
    if (ready(h, 1) < 0) return -1;
    static const char ok[] = "{\"status\":\"ok\"}\n";
    attnd_reply_borrow(&h->r.reply, AOK, ok, sizeof ok - 1);
    return 0;
}

/* GET /v2/health/live: the protocol's health answers are their status,
 * with an empty body (docs/api.md, "Open Inference Protocol: MUST and
 * SHOULD"). */
int attnd_handle_v2_live(hreq *h) {
    attnd_reply_borrow(&h->r.reply, AOK, "", 0);
    return 0;
}

/* GET /v2/health/ready */
int attnd_handle_v2_ready(hreq *h) {
    if (ready(h, 1) < 0) return -1;
    attnd_reply_borrow(&h->r.reply, AOK, "", 0);
    return 0;
}

/* GET /v1/models */
int attnd_handle_models(hreq *h) {
    attnd_reply_borrow(&h->r.reply, AOK, h->srv->models_body, strlen(h->srv->models_body));
    return 0;
}

/* GET /metrics */
int attnd_handle_metrics(hreq *h) {
    attnd_server *s = h->srv;
    int *depth = calloc((size_t)s->n_models, sizeof(int));
    attnd_sbuf b;
    attnd_sb_init(&b);
    if (depth) attnd_sched_depths(s->sched, depth);
    attnd_metrics_write(&s->metrics, &b, s->names, depth ? depth : (int[1]){0},
                        depth ? s->n_models : 0);
    attnd_sched_metrics(s->sched, &b);
    attnd_steps_metrics(s->sessions, &b);
    free(depth);
    size_t len = 0;
    char *body = attnd_sb_take(&b, &len);
    if (!body) return attnd_set_error(&h->err, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&h->r.reply, AOK, body, len, 0);
    h->ctype = "text/plain; version=0.0.4; charset=utf-8";
    return 0;
}

/* GET /openapi.json */
int attnd_handle_openapi(hreq *h) {
    attnd_reply_borrow(&h->r.reply, AOK, attnd_openapi_json, attnd_openapi_json_len);
    return 0;
}

/* GET /v2 */
int attnd_handle_v2(hreq *h) {
    attnd_reply_borrow(&h->r.reply, AOK, h->srv->v2_body, strlen(h->srv->v2_body));
    return 0;
}

/* GET /v2/models/{name} and /v2/models/{name}/versions/{version} */
int attnd_handle_v2_model(hreq *h) {
    int mi = path_model(h);
    if (mi < 0) return -1;
    const char *body = h->srv->v2_model_body[mi];
    attnd_reply_borrow(&h->r.reply, AOK, body, strlen(body));
    return 0;
}

/* GET /v2/models/{name}/ready and its versions/{version} form */
int attnd_handle_v2_model_ready(hreq *h) {
    if (path_model(h) < 0 || ready(h, 0) < 0) return -1;
    attnd_reply_borrow(&h->r.reply, AOK, "", 0);
    return 0;
}

/* GET /ui and /ui/{name}: the viewer's page and files (ui.c), without
 * the key like /health (they hold no data); 404 with server.ui off. The
 * page starts with "<!doctype html>", never "<html>" (httperr.c). */
int attnd_handle_ui(hreq *h) {
    const attnd_ui_file *f = h->srv->cfg->ui ? attnd_ui_find(h->rm.name) : NULL;
    if (!f)
        return attnd_set_error(&h->err, AERR_NOT_FOUND, "no route %s %.100s", h->method, h->path);
    const char *inm = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "If-None-Match");
    h->ui = f;
    h->ctype = f->type;
    if (attnd_ui_fresh(f, inm))
        attnd_reply_borrow(&h->r.reply, AOK_UNCHANGED, "", 0);
    else
        attnd_reply_borrow(&h->r.reply, AOK, f->data, f->len);
    return 0;
}

/* Suspends the connection and queues the parsed job (tokens set): the
 * scheduler's reply, or its refusal, goes out when it resumes. */
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

/* DELETE /v1/sessions/{id} */
int attnd_handle_session_delete(hreq *h) {
    attnd_server *s = h->srv;
    if (attnd_session_delete(s->sessions, h->rm.name, attnd_step_now()) != SESS_OK)
        return attnd_set_error(&h->err, AERR_NOT_FOUND, ATTND_MSG_NO_SESSION, h->rm.name,
                               attnd_session_status_text(SESS_NOT_FOUND));
    attnd_reply_borrow(&h->r.reply, AOK_NO_CONTENT, "", 0);
    return 0;
}

/* POST /v1/sessions and /v1/sessions/{id}/attention: the body becomes a
 * job and a begun step (steps.c), queued like any compute. */
static int session_route(hreq *h, const char *id, const char *want_id) {
    attnd_server *s = h->srv;
    char opened[ATTND_SESSION_ID_LEN + 1];
    attnd_step_env se = {s->sessions, &s->env, s->cfg, id, want_id, attnd_step_now()};
    int rc = attnd_step_prepare(&se, h->in.p ? h->in.p : "", h->in.len, &h->r.job, &h->r.step,
                                opened, &h->err, &h->retry_after);
    drop_body(h);
    if (rc < 0) return -1;
    if (!h->r.step) { /* opened with no prefix: nothing to compute */
        size_t len = 0;
        char *body = attnd_step_open_answer(opened, s->names[h->r.job.model], &len);
        if (!body) return attnd_set_error(&h->err, AERR_INTERNAL, "out of memory");
        attnd_reply_set(&h->r.reply, AOK_CREATED, body, len, 0);
        return 0;
    }
    h->r.tokens = h->r.job.L; /* the batch limit counts new rows (docs/api.md) */
    return submit(h);
}

/* POST /v1/sessions: its id from X-Session-Id when given */
int attnd_handle_session_open(hreq *h) {
    return session_route(h, NULL,
                         MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "X-Session-Id"));
}

/* POST /v1/sessions/{id}/attention */
int attnd_handle_session_step(hreq *h) {
    return session_route(h, h->rm.name, NULL);
}

/* A v2 infer whose parameters open a session (session_open) or step one
 * (session_id): the parsed job becomes a begun step (steps.c). An open
 * takes its id from X-Session-Id when given, as the native open does, so
 * that a load balancer hashing on that header keeps the session's steps on
 * this replica (docs/deploy.md); a step's header is not read (its id is in
 * the parameters). */
static int v2_session(hreq *h) {
    attnd_server *s = h->srv;
    attnd_job *job = &h->r.job;
    if (job->session_id && job->session_open)
        return attnd_set_error(&h->err, AERR_BAD_REQUEST,
                               "parameters: give session_id (a step) or session_open, not both");
    const char *want_id =
        job->session_open ? MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "X-Session-Id")
                          : NULL;
    attnd_step_env se = {s->sessions, &s->env, s->cfg, job->session_id, want_id, attnd_step_now()};
    if (attnd_step_from_job(&se, job, &h->r.step, &h->err, &h->retry_after) < 0) return -1;
    h->r.tokens = job->L;
    return submit(h);
}

/* POST /v1/attention and /v1/models/{name}/attention */
int attnd_handle_attention(hreq *h) {
    attnd_server *s = h->srv;
    const char *path_model = h->rm.name[0] ? h->rm.name : NULL;
    int rc = attnd_parse_native(&s->env, path_model, h->in.p ? h->in.p : "", h->in.len, &h->r.job,
                                &h->err);
    drop_body(h);
    if (rc < 0) return -1;
    h->r.tokens = attnd_job_tokens(&h->r.job);
    return submit(h);
}

/* POST /v2/models/{name}/infer and its versions/{version} form; the body
 * may carry the binary data extension (Inference-Header-Content-Length:
 * its JSON part's length). */
int attnd_handle_v2_infer(hreq *h) {
    attnd_server *s = h->srv;
    if (h->rm.version[0] && strcmp(h->rm.version, "1") != 0)
        return attnd_set_error(&h->err, AERR_NOT_FOUND,
                               "unknown model version '%s' (attnd serves version 1)",
                               h->rm.version);
    const char *hl =
        MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    uint64_t json_len = 0;
    if (hl && (parse_size(hl, (uint64_t)h->in.len, &json_len) < 0 || json_len == 0))
        return attnd_set_error(&h->err, AERR_BAD_REQUEST,
                               "Inference-Header-Content-Length: '%.40s' is not a size from 1 to "
                               "the body's length",
                               hl);
    int rc = attnd_parse_v2(&s->env, h->rm.name, h->in.p ? h->in.p : "", h->in.len,
                            (size_t)json_len, &h->r.job, &h->err);
    drop_body(h);
    if (rc < 0) return -1;
    if (h->r.job.session_id || h->r.job.session_open) return v2_session(h);
    h->r.tokens = attnd_job_tokens(&h->r.job);
    return submit(h);
}

/* OPTIONS on a route, with CORS on: the route's methods (Allow), and the
 * preflight's headers when the origin is allowed. */
static int preflight(hreq *h) {
    attnd_reply_borrow(&h->r.reply, AOK_PREFLIGHT, "", 0);
    return 0;
}

/* The body is in (or there was none), or a refusal goes out before it:
 * answer, or queue. */
static enum MHD_Result dispatch(hreq *h) {
    int rc = -1;
    if (h->err.code != AOK)
        rc = -1; /* refused before its handler */
    else if (strcmp(h->method, "OPTIONS") == 0)
        rc = preflight(h);
    else
        rc = h->rm.route->handle(h);
    if (rc < 0)
        attnd_reply_error(&h->r.reply, &h->err);
    else if (h->phase == P_WAIT)
        return MHD_YES; /* queued: the scheduler's reply goes out on resume */
    return send_reply(h);
}

/* What a body declared or sent at the start holds in memory at most before
 * more of it has arrived, bytes. */
#define BODY_RESERVE_MAX (64 << 10)

/* The model an attention request is for, when its header lines tell (the
 * path names it, or only one is served); -1 when only its body can. */
static int target_model(const attnd_server *s, const hreq *h) {
    if (!route_has(h, ROUTE_QUEUE_FIRST)) return -1;
    if (!h->rm.name[0]) return s->n_models == 1 ? 0 : -1;
    attnd_error later; /* an unknown model is refused once the body is read */
    return attnd_find_model(&s->env, h->rm.name, &later);
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

/* The 429 of a body that would pass server.max_buffered_body_bytes (the
 * bodies held over every connection; docs/config.md, "Memory"): its bytes,
 * then the limit. */
#define MSG_BUDGET                                                                                 \
    "%lld more body bytes would pass the server's limit on request bodies held at once "           \
    "(server.max_buffered_body_bytes, %lld); retry later"

/* The declared body size: 413 past max_body_bytes and 429 past the body
 * budget go out at once; a size that fits reserves a little room. */
static void examine_length(hreq *h, const char *cl) {
    attnd_server *s = h->srv;
    /* libmicrohttpd refuses what is not a number of bytes; past max_body_bytes the
     * exact number does not matter, only that it is too many */
    uint64_t v;
    if (parse_size(cl, (uint64_t)s->cfg->max_body_bytes, &v) < 0) {
        if (strspn(cl, "0123456789") == strlen(cl) && cl[0])
            attnd_set_error(&h->err, AERR_TOO_LARGE, "body of %.40s bytes, the limit is %lld", cl,
                            s->cfg->max_body_bytes);
        else
            attnd_set_error(&h->err, AERR_BAD_REQUEST,
                            "Content-Length: '%.40s' is not a decimal number of bytes", cl);
        h->refuse_now = 1;
        return;
    }
    long long n = (long long)v; /* at most max_body_bytes (2^34) */
    long long room = s->cfg->max_buffered_body_bytes - atomic_load(&s->buffered);
    if (n > room && route_has(h, ROUTE_COMPUTE)) {
        attnd_set_error(&h->err, AERR_QUEUE_FULL, MSG_BUDGET, n, s->cfg->max_buffered_body_bytes);
        h->refuse_now = 1;
    } else if (n > 0 && route_has(h, ROUTE_COMPUTE)) {
        /* a declaration reserves nothing: memory follows the bytes that arrive */
        /* room for n bytes and the NUL: at most BODY_RESERVE_MAX (attnd_sbuf rounds to a
         * power of two, so n + 1 past it would double the reserve) */
        attnd_sb_reserve(&h->in, (size_t)(n < BODY_RESERVE_MAX ? n : BODY_RESERVE_MAX - 1));
    }
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
        attnd_set_error(&h->err, AERR_NOT_FOUND, "no route %s %.100s", h->method, h->path);
        return;
    }
    if (h->rm.status == 405) {
        attnd_set_error(&h->err, AERR_METHOD, "%s is not allowed on %.100s (allowed: %s)",
                        h->method, h->path, h->rm.allow);
        return;
    }
    if (strcmp(h->method, "OPTIONS") == 0) return; /* preflights carry no credentials */
    if (s->api_key && !route_has(h, ROUTE_OPEN) &&
        !key_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        attnd_set_error(&h->err, AERR_UNAUTHORIZED,
                        "missing or wrong API key: send Authorization: Bearer <key>");
        return;
    }
    if (route_has(h, ROUTE_COMPUTE) && atomic_load(&s->state) != S_READY) {
        attnd_set_error(&h->err, AERR_UNAVAILABLE, "the server is draining");
        return;
    }
    if (queue_full(s, h)) {
        attnd_set_error(&h->err, AERR_QUEUE_FULL,
                        "the queue of model '%s' is full (%d requests); retry later",
                        s->names[target_model(s, h)], s->cfg->max_queue_requests);
        h->refuse_now = 1;
        return;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl) examine_length(h, cl);
}

/* A request whose header lines are in: its record, with the path it logs
 * and its X-Request-Id (the client's when sane, else made). NULL when out
 * of memory. */
static hreq *hreq_new(attnd_server *s, struct MHD_Connection *conn, const char *url,
                      const char *method) {
    hreq *h = calloc(1, sizeof(*h));
    if (!h) return NULL;
    atomic_init(&h->r.refs, 1);
    h->r.free_fn = hreq_free;
    h->sock = -1;
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
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    h->gc = ci ? ci->socket_context : NULL;
    return h;
}

/* n more bytes of the body: kept while the request is not refused and
 * they fit max_body_bytes and the body budget; read and dropped after a
 * refusal, but not without end. */
static enum MHD_Result take_body(hreq *h, const char *data, size_t n) {
    attnd_server *s = h->srv;
    h->in_total += (long long)n;
    if (h->phase != P_BODY) return MHD_YES;
    if (h->err.code == AOK) {
        if ((long long)(h->in.len + n) > s->cfg->max_body_bytes) {
            attnd_set_error(&h->err, AERR_TOO_LARGE, "body over the limit of %lld bytes",
                            s->cfg->max_body_bytes);
            drop_body(h);
        } else if (budget_take(s, (long long)n) < 0) {
            attnd_set_error(&h->err, AERR_QUEUE_FULL, MSG_BUDGET, (long long)n,
                            s->cfg->max_buffered_body_bytes);
            drop_body(h);
        } else {
            h->in_held += (long long)n;
            attnd_sb_put(&h->in, data, n);
            if (h->in.oom) {
                attnd_set_error(&h->err, AERR_INTERNAL, "out of memory reading the body");
                drop_body(h);
            }
        }
    }
    if (h->err.code != AOK && h->in_total > 2 * s->cfg->max_body_bytes + (1 << 20)) return MHD_NO;
    return MHD_YES;
}

/* libmicrohttpd's access handler, called for each request: first with its
 * header lines, then with each piece of its body, then once the body is
 * in, and again when the scheduler resumes a queued request. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    attnd_server *s = cls;
    hreq *h = *con_cls;
    if (!h) {
        if (!(h = hreq_new(s, conn, url, method))) return MHD_NO;
        *con_cls = h;
        atomic_fetch_add(&s->active, 1);
        examine(h, url);
        if (h->refuse_now) { /* 413 or 429 now, before the body is read */
            attnd_guard_phase(s->guard, h->gc, GUARD_BUSY);
            return dispatch(h);
        }
        attnd_guard_phase(s->guard, h->gc, GUARD_BODY);
        h->phase = P_BODY;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        return take_body(h, upload_data, n);
    }
    if (h->phase == P_WAIT) { /* resumed: the scheduler answered */
        if (h->gone) return MHD_NO;
        /* queued work dropped at the drain deadline: a refusal, not its answer */
        if (atomic_load(&s->past_deadline) && h->r.reply.kind == AERR_UNAVAILABLE) h->late = 1;
        return send_reply(h);
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
        h->gone || !h->status)
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
    } else if (status == 0 || h->gone) { /* the client left before the answer */
        status = 499;
        attnd_metrics_disconnect(&s->metrics);
    } else if (attnd_kind_is_error(h->sent)) {
        attnd_metrics_reject(&s->metrics, h->sent);
    }
    attnd_metrics_request(&s->metrics, h->rid, status, now - h->t_recv_us);
    attnd_access a = {
        h->method,           h->path, status, h->sent_bytes, (double)(now - h->t_recv_us) / 1e3,
        h->r.batch_requests, h->id,   end};
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

/* ---- the scheduler's callbacks (batcher and sweeper threads) ---- */

/* A queued request's reply is ready, or its client left: the handler,
 * called again, sends it or closes. */
static void on_answer_ready(attnd_req *r, void *arg) {
    (void)arg;
    hreq *h = (hreq *)r;
    MHD_resume_connection(h->conn);
}

/* 1 when the peer of a polled socket has closed (or the socket failed). */
static int hung_up(const struct pollfd *pf) {
    if (pf->revents & (POLLHUP | POLLERR | POLLRDHUP)) return 1;
    char c;
    return (pf->revents & POLLIN) && recv(pf->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* The scheduler asks which of n queued or batched requests lost their
 * client (attnd_sched_opts.departed). Their connections are suspended, so
 * each socket is still open on our side; a peer that closed makes it
 * readable at EOF. One poll over all of them; a request whose client left
 * is marked gone and closed, not answered, when it resumes. */
static void find_departed(attnd_req *const *rs, int n, char *left, void *arg) {
    (void)arg;
    struct pollfd few[64], *pf = n <= 64 ? few : malloc((size_t)n * sizeof *pf);
    if (!pf) return; /* out of memory: asked again at the next sweep */
    for (int i = 0; i < n; i++)
        pf[i] = (struct pollfd){.fd = ((const hreq *)rs[i])->sock, .events = POLLIN | POLLRDHUP};
    if (poll(pf, (nfds_t)n, 0) > 0)
        for (int i = 0; i < n; i++)
            if (pf[i].revents && hung_up(&pf[i])) {
                ((hreq *)rs[i])->gone = 1;
                left[i] = 1;
            }
    if (pf != few) free(pf);
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
                          attnd_enum_name(&attnd_rope_styles, r->style));
    const char *type = attnd_enum_name(&attnd_rope_scalings, r->scaling);
    if (r->scaling == ATTN_ROPE_SCALE_LINEAR)
        json_object_set_new(j, "scaling",
                            json_pack("{s:s, s:f}", "type", type, "factor", r->factor));
    if (r->scaling == ATTN_ROPE_SCALE_LLAMA3)
        json_object_set_new(j, "scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "type", type, "factor",
                                      r->factor, "low_freq_factor", r->low_freq_factor,
                                      "high_freq_factor", r->high_freq_factor,
                                      "original_max_position_embeddings",
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
                     from_file ? "attnd_safetensors" : "attnd_embedded", "inputs", in, "outputs",
                     v2_tensor("output", "FP32", 3, hp->embed_dim),
                     v2_tensor("attention", "FP32", 4, 0));
}

/* One model of GET /v1/models: its hyper-parameters as loaded. */
static json_t *model_json(const attnd_server *s, int i) {
    const attnd_model_config *mc = &s->cfg->models[i];
    const attn_hparams *hp = &s->info[i].hp; /* filled in by attn_model_init */
    json_t *m = json_pack(
        "{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:b, s:b, s:s}", "name", s->names[i], "embed_dim",
        hp->embed_dim, "num_heads", hp->num_heads, "num_kv_heads", hp->num_kv_heads, "head_dim",
        hp->head_dim, "kdim", hp->kdim, "vdim", hp->vdim, "scale", hp->scale, "bias", hp->bias,
        "causal", hp->causal, "weights", mc->weights ? "safetensors" : "embedded");
    if (hp->rope.dim) json_object_set_new(m, "rope", rope_json(&hp->rope));
    if (mc->max_positions) json_object_set_new(m, "max_positions", json_integer(mc->max_positions));
    return m;
}

/* GET /v1/models: the models, the limits, batching, and what computes. */
static json_t *models_json(const attnd_server *s) {
    const attnd_config *c = s->cfg;
    json_t *models = json_array();
    for (int i = 0; i < s->n_models; i++)
        json_array_append_new(models, model_json(s, i));
    const attn_blas_info *blas = attn_blas_get_info();
    attnd_cpus cpus;
    attnd_cpus_count(&cpus);
    json_t *root = json_pack(
        "{s:o, s:{s:I, s:I, s:I, s:i}, s:{s:i, s:i, s:i, s:i}, s:{s:i}, s:{s:i, s:i, s:i, s:s, "
        "s:b, "
        "s:s}}",
        "models", models, "limits", "max_body_bytes", (json_int_t)c->max_body_bytes,
        "max_tokens_per_request", (json_int_t)c->max_tokens_per_request, "max_attention_floats",
        (json_int_t)c->max_attention_floats, "request_timeout_ms", c->request_timeout_ms,
        "batching", "max_batch_tokens", c->max_batch_tokens, "max_batch_requests",
        c->max_batch_requests, "max_queue_delay_us", c->max_queue_delay_us, "max_queue_requests",
        c->max_queue_requests, "workers", "threads", c->worker_threads, "compute", "threads",
        c->worker_threads, "cpus", cpus.n, "http_threads", c->http_threads, "blas_core",
        blas ? blas->core : "none", "blas_core_from_env", blas && blas->by_user, "cpu_features",
        blas ? blas->features : "");
    json_t *lim = json_object_get(root, "limits");
    json_object_set_new(lim, "max_sessions", json_integer(c->max_sessions));
    json_object_set_new(lim, "max_session_bytes", json_integer(c->max_session_bytes));
    json_object_set_new(lim, "max_session_bytes_each", json_integer(c->max_session_bytes_each));
    json_object_set_new(lim, "session_idle_s", json_integer(c->session_idle_s));
    return root;
}

/* The bodies of the routes that only describe the server, written once. */
static int build_bodies(attnd_server *s) {
    const attn_blas_info *blas = attn_blas_get_info();
    s->models_body = dump(models_json(s));
    s->v2_body =
        dump(json_pack("{s:s, s:s, s:[s], s:s, s:s}", "name", "attnd", "version", ATTND_VERSION,
                       "extensions", "binary_tensor_data", "blas_core", blas ? blas->core : "none",
                       "cpu_features", blas ? blas->features : ""));
    s->v2_model_body = calloc((size_t)s->n_models, sizeof(char *));
    if (!s->models_body || !s->v2_body || !s->v2_model_body) return -1;
    for (int i = 0; i < s->n_models; i++)
        if (!(s->v2_model_body[i] = dump(
                  v2_model_json(s->names[i], &s->info[i].hp, s->cfg->models[i].weights != NULL))))
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
        attnd_log(
            LOG_INFO,
            "model %s: embed_dim=%d num_heads=%d kdim=%d vdim=%d bias=%s causal=%s weights=%s",
            mc->name, hp->embed_dim, hp->num_heads, hp->kdim, hp->vdim, hp->bias ? "true" : "false",
            hp->causal ? "true" : "false",
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
        NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)c->http_threads, MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)c->connection_timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        s, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_END);
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

attnd_server *attnd_server_new(const attnd_config *cfg, attnd_exit *why, char *err, size_t errlen) {
    *why = ATTND_EXIT_INTERNAL;
    attnd_server *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->cfg = cfg;
    const char *labels[R_COUNT + 1];
    attnd_route_labels(labels);
    attnd_metrics_init(&s->metrics, labels, R_COUNT + 1);
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
    attnd_sched_opts o = {cfg, s->models,     s->info, s->n_models, &s->metrics, on_answer_ready,
                          s,   find_departed, s};
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
