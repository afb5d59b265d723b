/* glue.c - libmicrohttpd's callbacks, the top of the HTTP side: one access
 * handler walks every request through route -> auth -> body -> handler
 * (the row's of the route table, routes.c; a CORS preflight is a row too)
 * and every answer goes out through send.c. A refusal is an attnd_error in
 * the request, made into its reply by attnd_reply_error. Also here: each
 * connection's record in the guard, the body budget
 * (server.max_buffered_body_bytes), the access log line and metrics at a
 * request's end, the scheduler's two callbacks, start and stop. It calls
 * the table, send.c and hreq.c; nothing calls it back.
 */
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../obs/log.h"
#include "../obs/otlp.h"
#include "hreq.h"
#include "routes.h"
#include "status.h"

/* ---- small helpers ---- */

/* Counts n more body bytes in the budget; 0 when they fit, -1 when not. */
static int budget_take(attnd_http *s, long long n) {
    if (atomic_fetch_add(&s->buffered, n) + n <= s->cfg->max_buffered_body_bytes) return 0;
    atomic_fetch_sub(&s->buffered, n);
    return -1;
}

/* The request's free_fn (batch/req.h). */
static void hreq_free(attnd_req *r) {
    hreq *h = (hreq *)r;
    attnd_req_clear(r);
    attnd_http_drop_body(h);
    attnd_http_free_values(h);
    free(h);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int key_ok(const attnd_http *s, const char *hdr) {
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

static const char *cors_origin(const attnd_http *s, hreq *h) {
    if (s->cfg->n_cors_origins == 0) return NULL;
    const char *o = attnd_http_header(h, "Origin");
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

/* ---- a request's road ---- */

/* The body is in (or there was none), or a refusal goes out before it:
 * answer, or queue. */
static enum MHD_Result dispatch(hreq *h) {
    int rc = -1; /* refused before its handler */
    if (h->err.code == AOK) rc = h->rm.route->handle(h);
    if (rc < 0)
        attnd_reply_error(&h->r.reply, &h->err);
    else if (h->phase == P_WAIT)
        return MHD_YES; /* queued: the scheduler's reply goes out on resume */
    return attnd_http_send(h);
}

/* What a body declared or sent at the start holds in memory at most before
 * more of it has arrived, bytes. */
#define BODY_RESERVE_MAX (64 << 10)

/* Lingering, as nginx's lingering_time and lingering_timeout: a request
 * refused at its header lines (413, 429) has the rest of its body read and
 * dropped, at most LINGER_BYTES of it within LINGER_MS (or body_timeout_ms
 * when shorter: the guard's GUARD_LINGER), before its answer goes out and
 * the connection closes. Closing with the body unread resets the
 * connection, and a client that sends its whole body before it reads
 * (Python's http.client, so urllib) then fails with a broken pipe and never
 * sees the 429 or its Retry-After. The dropped bytes are neither held nor
 * counted in the body budget; the bounds keep a slow or endless sender
 * from holding the connection (docs/config.md, "Connections"). */
#define LINGER_BYTES (16LL << 20)
#define LINGER_MS 3000

/* The slot of the model an attention request is for, when its header
 * lines tell (the path names it, or only one is served), its name into
 * name; -1 when only its body can. */
static int target_model(const attnd_http *s, const hreq *h, char name[ATTND_NAME_MAX]) {
    if (!route_has(h, ROUTE_QUEUE_FIRST)) return -1;
    if (h->rm.name[0]) { /* an unknown model is refused once the body is read */
        snprintf(name, ATTND_NAME_MAX, "%.63s", h->rm.name);
        return attnd_models_slot(s->env->models, h->rm.name);
    }
    attnd_version *one = attnd_models_sole(s->env->models);
    int slot = one ? one->slot : -1;
    if (one) snprintf(name, ATTND_NAME_MAX, "%s", one->name);
    attnd_version_unref(one);
    return slot;
}

/* 1 when the request's model is known and its queue is full now: the 429 it
 * would get after parsing is decided before its body is kept or decoded.
 * The scheduler checks again at admission. */
static int queue_full(attnd_http *s, const hreq *h, char name[ATTND_NAME_MAX]) {
    int slot = target_model(s, h, name);
    return slot >= 0 && attnd_sched_depth(s->sched, slot) >= s->cfg->max_queue_requests;
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
    attnd_http *s = h->srv;
    /* libmicrohttpd refuses what is not a number of bytes; past max_body_bytes the
     * exact number does not matter, only that it is too many */
    uint64_t v;
    if (attnd_http_size(cl, (uint64_t)s->cfg->max_body_bytes, &v) < 0) {
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

/* 1 when the body has no end libmicrohttpd can find: a Transfer-Encoding
 * other than chunked (as sent, which is what it compares), which it would
 * read until the client closes. */
static int unbounded(hreq *h) {
    const char *te = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "Transfer-Encoding");
    return te && strcasecmp(te, "chunked") != 0;
}

/* Content-Length's values: *first, and 1 when another one differs. */
typedef struct {
    const char *first;
    int differ;
} lengths;

static enum MHD_Result each_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    (void)kind;
    lengths *l = cls;
    if (strcasecmp(key, "Content-Length") != 0 || !value) return MHD_YES;
    if (!l->first)
        l->first = value;
    else if (strcmp(l->first, value) != 0)
        l->differ = 1;
    return MHD_YES;
}

/* The framing of the body: a Transfer-Encoding attnd cannot read, or two
 * Content-Lengths that disagree (RFC 9112, 6.1 and 6.3), is a 400 at once
 * and the connection closed: where the body ends is not known. */
static int examine_framing(hreq *h) {
    if (unbounded(h)) {
        attnd_set_error(&h->err, AERR_BAD_REQUEST,
                        "Transfer-Encoding: '%.40s' is not read; send a Content-Length or "
                        "Transfer-Encoding: chunked",
                        MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "Transfer-Encoding"));
        return h->refuse_now = 1;
    }
    lengths l = {NULL, 0};
    MHD_get_connection_values(h->conn, MHD_HEADER_KIND, each_length, &l);
    if (!l.differ) return 0;
    attnd_set_error(&h->err, AERR_BAD_REQUEST, "Content-Length: two different values; send one");
    return h->refuse_now = 1;
}

/* First call: route, method, key, draining, a full queue, declared body
 * size. 413 and 429 (queue full, body budget) are decided before the body
 * is read, which is never kept, and close the connection (lingers() says
 * when they go out); other refusals wait for the body so the connection
 * stays usable. */
static void examine(hreq *h, const char *url) {
    attnd_http *s = h->srv;
    attnd_route_find(h->method, url, s->cfg->n_cors_origins > 0, &h->rm);
    h->rid = h->rm.path ? h->rm.path->id : R_UNKNOWN; /* a preflight counts under its path's */
    h->origin = cors_origin(s, h);
    if (examine_framing(h)) return;
    if (h->rm.status == 404) {
        attnd_set_error(&h->err, AERR_NOT_FOUND, "no route %s %.100s", h->method, h->path);
        return;
    }
    if (h->rm.status == 405) {
        attnd_set_error(&h->err, AERR_METHOD, "%s is not allowed on %.100s (allowed: %s)",
                        h->method, h->path, h->rm.allow);
        return;
    }
    if (route_has(h, ROUTE_PREFLIGHT)) return; /* preflights carry no credentials */
    /* the port opens before the models load (server.c): until they are in,
     * the health routes say so and nothing else is answered */
    if (atomic_load(&s->state) == S_STARTING && h->rid != R_HEALTH && h->rid != R_V2_LIVE &&
        h->rid != R_V2_READY) {
        attnd_set_error(&h->err, AERR_UNAVAILABLE,
                        "the server is starting: its models are loading");
        return;
    }
    if (s->api_key && !route_has(h, ROUTE_OPEN) &&
        !key_ok(s, attnd_http_header(h, "Authorization"))) {
        attnd_set_error(&h->err, AERR_UNAUTHORIZED,
                        "missing or wrong API key: send Authorization: Bearer <key>");
        return;
    }
    if (route_has(h, ROUTE_COMPUTE) && atomic_load(&s->state) != S_READY) {
        attnd_set_error(&h->err, AERR_UNAVAILABLE, "the server is draining");
        return;
    }
    const char *ce = attnd_http_header(h, "Content-Encoding");
    if (ce && strcasecmp(ce, "identity") != 0 && strcmp(h->method, "POST") == 0) {
        /* gzip, deflate (tritonclient's request compression): never read as JSON */
        attnd_set_error(&h->err, AERR_BAD_REQUEST,
                        "Content-Encoding: '%.40s' bodies are not read; send the body "
                        "uncompressed (attnd reads identity only)",
                        ce);
        return;
    }
    char name[ATTND_NAME_MAX];
    if (queue_full(s, h, name)) {
        attnd_set_error(&h->err, AERR_QUEUE_FULL,
                        "the queue of model '%s' is full (%d requests); retry later", name,
                        s->cfg->max_queue_requests);
        h->refuse_now = 1;
        return;
    }
    const char *cl = attnd_http_header(h, "Content-Length");
    if (cl) examine_length(h, cl);
}

/* What the trace headers of a request hold: traceparent (the first, and
 * how many were given) and tracestate (every one, joined by commas, as the
 * spec asks; cut past its room, which attnd_tracestate_clean then refuses
 * or trims). */
typedef struct {
    const char *parent;
    int n_parent;
    char state[2 * ATTND_TRACESTATE_MAX + 2];
    size_t state_len;
} trace_headers;

static enum MHD_Result trace_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    (void)kind;
    trace_headers *t = cls;
    if (strcasecmp(key, "traceparent") == 0 && t->n_parent++ == 0) t->parent = value;
    if (strcasecmp(key, "tracestate") == 0 && value) {
        size_t room = sizeof t->state - 1 - t->state_len, n = strlen(value);
        if (t->state_len && room) t->state[t->state_len++] = ',', room--;
        if (n > room) n = room;
        memcpy(t->state + t->state_len, value, n);
        t->state[t->state_len += n] = '\0';
    }
    return MHD_YES;
}

/* The request's place in a trace (obs/trace.h): the caller's traceparent
 * continued, or a new trace when it is absent, malformed or given twice. */
static void start_trace(hreq *h) {
    trace_headers t = {0};
    MHD_get_connection_values(h->conn, MHD_HEADER_KIND, trace_header, &t);
    attnd_trace_start(&h->trace, t.n_parent == 1 ? t.parent : NULL, t.state_len ? t.state : NULL);
}

/* A request whose header lines are in: its record, with the path it logs,
 * its X-Request-Id (the client's when sane, else made) and its trace. NULL
 * when out of memory. */
static hreq *hreq_new(attnd_http *s, struct MHD_Connection *conn, const char *url,
                      const char *method) {
    hreq *h = calloc(1, sizeof(*h));
    if (!h) return NULL;
    attnd_req_init(&h->r, hreq_free);
    h->sock = -1;
    h->srv = s;
    h->conn = conn;
    h->t_recv_us = attnd_mono_us();
    h->t_recv_unix_ns = attnd_unix_ns();
    snprintf(h->method, sizeof(h->method), "%s", method);
    snprintf(h->path, sizeof(h->path), "%s", url);
    for (char *p = h->path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == ' ' || *p == 0x7f) *p = '?';
    attnd_http_request_id(attnd_http_header(h, "X-Request-Id"), h->id);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    h->hc = ci ? ci->socket_context : NULL;
    h->gc = h->hc ? h->hc->gc : NULL;
    if (h->hc) h->hc->req_id = h->id;
    start_trace(h);
    return h;
}

/* 1 when a request refused at its header lines has its body read and
 * dropped before the answer (LINGER_BYTES above). Not when the client waits
 * for "100 Continue" before it sends (it hears the answer at once and sends
 * nothing), nor when it declares more than the linger would read (the
 * answer goes out at once, the connection closes unread). */
static int lingers(hreq *h) {
    if (unbounded(h)) return 0;
    const char *expect = attnd_http_header(h, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0) return 0;
    const char *cl = attnd_http_header(h, "Content-Length");
    uint64_t n;
    return !cl || attnd_http_size(cl, (uint64_t)LINGER_BYTES, &n) == 0;
}

/* n more bytes of the body: kept while the request is not refused and
 * they fit max_body_bytes and the body budget; read and dropped after a
 * refusal, but not without end (after a refusal at the header lines,
 * LINGER_BYTES: only a chunked body, with no size declared, can pass it). */
static enum MHD_Result take_body(hreq *h, const char *data, size_t n) {
    attnd_http *s = h->srv;
    h->in_total += (long long)n;
    if (h->phase != P_BODY) return MHD_YES;
    if (h->err.code == AOK) {
        if ((long long)(h->in.len + n) > s->cfg->max_body_bytes) {
            attnd_set_error(&h->err, AERR_TOO_LARGE, "body over the limit of %lld bytes",
                            s->cfg->max_body_bytes);
            attnd_http_drop_body(h);
        } else if (budget_take(s, (long long)n) < 0) {
            attnd_set_error(&h->err, AERR_QUEUE_FULL, MSG_BUDGET, (long long)n,
                            s->cfg->max_buffered_body_bytes);
            attnd_http_drop_body(h);
        } else {
            h->in_held += (long long)n;
            attnd_sb_put(&h->in, data, n);
            if (h->in.oom) {
                attnd_set_error(&h->err, AERR_INTERNAL, "out of memory reading the body");
                attnd_http_drop_body(h);
            }
        }
    }
    if (h->refuse_now) return h->in_total > LINGER_BYTES ? MHD_NO : MHD_YES;
    if (h->err.code != AOK && h->in_total > 2 * s->cfg->max_body_bytes + (1 << 20)) return MHD_NO;
    return MHD_YES;
}

/* libmicrohttpd's access handler, called for each request: first with its
 * header lines, then with each piece of its body, then once the body is
 * in, and again when the scheduler resumes a queued request. A request
 * that needs compute is parsed by its handler, its connection suspended,
 * and it is handed to the scheduler; the worker that answers it resumes
 * the connection, and this handler, called again, sends the answer. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    attnd_http *s = cls;
    hreq *h = *con_cls;
    if (!h) {
        if (!(h = hreq_new(s, conn, url, method))) return MHD_NO;
        *con_cls = h;
        atomic_fetch_add(&s->active, 1);
        examine(h, url);
        if (h->refuse_now && !lingers(h)) { /* 413 or 429 now, before the body */
            attnd_guard_phase(s->guard, h->gc, GUARD_BUSY);
            return dispatch(h);
        }
        /* a body to read (kept), or to drop before the 413 or 429 goes out */
        attnd_guard_phase(s->guard, h->gc, h->refuse_now ? GUARD_LINGER : GUARD_BODY);
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
        return attnd_http_send(h);
    }
    if (h->phase == P_SENT) return MHD_YES;
    attnd_guard_phase(s->guard, h->gc, GUARD_BUSY); /* the whole request is in */
    return dispatch(h);
}

/* The rejection reason counted for a status libmicrohttpd refused with. */
static attnd_kind refusal_kind(int status) {
    return status == 413 || status == 414 || status == 431 ? AERR_TOO_LARGE : AERR_BAD_REQUEST;
}

/* How a request ended, for the access log's end= field: "ok" only when its
 * whole answer went out. */
static const char *end_word(const hreq *h, enum MHD_RequestTerminationCode toe) {
    const char *cut = attnd_guard_cut(h->srv->guard, h->gc);
    if (cut) return cut;
    if (h->late) return "drain_deadline";
    /* stopped with it unanswered: cut at the deadline, or (no deadline
     * passed) it began as an idle drain ended, never admitted */
    if (toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
        return atomic_load(&h->srv->past_deadline) ? "drain_deadline" : "shutdown";
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && h->status) return "ok";
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) return "idle_timeout";
    /* an error while the answer goes out is its socket's: the client reset it */
    if (toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT || toe == MHD_REQUEST_TERMINATED_READ_ERROR ||
        toe == MHD_REQUEST_TERMINATED_WITH_ERROR || h->gone || !h->status)
        return "client_gone";
    return "error";
}

/* Unix nanoseconds of monotonic time t_us (0 stays 0: a phase never
 * reached), from now as seen on both clocks. */
static uint64_t unix_at(uint64_t t_us, uint64_t now_us, uint64_t now_ns) {
    if (!t_us) return 0;
    uint64_t ago = now_us > t_us ? (now_us - t_us) * 1000 : 0;
    return now_ns > ago ? now_ns - ago : 0;
}

/* The request's spans (request, queue, compute) to the OTLP exporter, when
 * one is set: copied into its queue, never waited for. */
static void export_spans(const hreq *h, int status, uint64_t now_us) {
    attnd_http *s = h->srv;
    if (!s->otlp) return;
    const attnd_req *r = &h->r;
    uint64_t now_ns = attnd_unix_ns();
    char route[ROUTE_CAPTURE_MAX];
    attnd_request_times t = {
        .trace = &h->trace,
        .method = h->method,
        .path = h->path,
        .route = h->rm.path ? attnd_route_template(h->rm.path, route, sizeof route) : NULL,
        .model = h->model[0] ? h->model : NULL,
        .request_id = h->id,
        .status = status,
        .batch_size = r->batch_requests,
        .start_ns = h->t_recv_unix_ns,
        .end_ns = now_ns,
        .queue_start_ns = unix_at(r->t_admit_us, now_us, now_ns),
        .queue_end_ns = unix_at(r->t_start_us ? r->t_start_us : now_us, now_us, now_ns),
        .compute_start_ns = unix_at(r->t_start_us, now_us, now_ns),
        .compute_end_ns = unix_at(r->t_end_us, now_us, now_ns)};
    if (!r->t_admit_us) t.queue_end_ns = 0;
    attnd_span spans[3];
    int n = attnd_request_spans(&t, spans);
    if (n) attnd_otlp_submit(s->otlp, spans, n);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    attnd_http *s = cls;
    hreq *h = *con_cls;
    if (!h) return;
    *con_cls = NULL;
    if (h->submitted) attnd_sched_cancel(s->sched, &h->r);
    uint64_t now = attnd_mono_us();
    int status = h->status;
    const char *end = end_word(h, toe);
    if (h->hc) h->hc->req_id = NULL;
    if (h->hc && h->hc->refused) { /* libmicrohttpd refused its body (send.c) */
        status = h->status = h->hc->refused;
        h->sent_bytes = h->hc->refused_bytes;
        h->hc->refused = 0;
        end = "refused";
        attnd_metrics_reject(s->metrics, refusal_kind(status));
    } else if (strcmp(end, "drain_deadline") == 0) {
        atomic_fetch_add(&s->cut, 1);
        attnd_log(LOG_WARN,
                  "request %s %s %s cut short at the drain deadline (%d s): its answer was not "
                  "delivered whole",
                  h->id, h->method, h->path, s->cfg->drain_grace_s);
    } else if (strcmp(end, "shutdown") == 0) {
        status = 503; /* closed unanswered: the daemon was no longer serving */
    } else if (status == 0 && strcmp(end, "client_gone") != 0) {
        status = 408; /* the guard closed it: too slow, or evicted (never sent) */
        attnd_metrics_disconnect(s->metrics);
    } else if (status == 0 || h->gone) { /* the client left before the answer */
        status = 499;
        attnd_metrics_disconnect(s->metrics);
    } else if (attnd_kind_is_error(h->sent)) {
        attnd_metrics_reject(s->metrics, h->sent);
    }
    attnd_metrics_request(s->metrics, h->rid, status, now - h->t_recv_us);
    char trace_id[2 * ATTND_TRACE_ID_BYTES + 1], span_id[2 * ATTND_SPAN_ID_BYTES + 1];
    attnd_hex(trace_id, h->trace.trace_id, sizeof h->trace.trace_id);
    attnd_hex(span_id, h->trace.span_id, sizeof h->trace.span_id);
    attnd_access a = {
        h->method,           h->path, status, h->sent_bytes, (double)(now - h->t_recv_us) / 1e3,
        h->r.batch_requests, h->id,   end,    trace_id,      span_id};
    attnd_log_access(&a); /* nothing secret: no headers, no body */
    export_spans(h, status, now);
    /* a kept-alive connection now waits for its next request's header lines */
    attnd_guard_phase(s->guard, h->gc, GUARD_HEADER);
    atomic_fetch_sub(&s->active, 1);
    attnd_req_unref(&h->r);
}

/* A request that libmicrohttpd refused before its header lines were in
 * (send.c), as the connection closes: counted under the unknown route and
 * logged with no method or path, which may never have been read. */
static void log_refusal(attnd_http *s, const hconn *hc) {
    attnd_metrics_reject(s->metrics, refusal_kind(hc->refused));
    attnd_metrics_request(s->metrics, R_UNKNOWN, hc->refused, 0);
    attnd_access a = {"-",       "-",  hc->refused, hc->refused_bytes, 0.0, 0, hc->refused_id,
                      "refused", NULL, NULL};
    attnd_log_access(&a);
}

/* Connection start and end: its record, and the guard's. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    attnd_http *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci) return;
        hconn *hc = calloc(1, sizeof(*hc));
        if (!hc) { /* refused as the guard refuses one it cannot record */
            shutdown(ci->connect_fd, SHUT_RDWR);
            return;
        }
        hc->gc = attnd_guard_open(s->guard, ci->connect_fd);
        *socket_context = hc;
    } else if (*socket_context) {
        hconn *hc = *socket_context;
        if (hc->refused) log_refusal(s, hc);
        attnd_guard_close(s->guard, hc->gc);
        free(hc);
        *socket_context = NULL;
    }
}

/* ---- the scheduler's callbacks (batcher and sweeper threads) ---- */

/* A queued request's reply is ready, or its client left: the handler,
 * called again, sends it or closes. */
void attnd_http_answer_ready(attnd_req *r, void *arg) {
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
void attnd_http_departed(attnd_req *const *rs, int n, char *left, void *arg) {
    (void)arg;
    struct pollfd few[64], *pf = n <= 64 ? few : malloc((size_t)n * sizeof *pf);
    if (!pf) return;            /* out of memory: asked again at the next sweep */
    for (int i = 0; i < n; i++) /* fd -1: poll skips it */
        pf[i] = (struct pollfd){.fd = rs[i]->proto == ATTND_PROTO_HTTP ? ((const hreq *)rs[i])->sock
                                                                       : -1,
                                .events = POLLIN | POLLRDHUP};
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

/* ---- start and stop ---- */

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

static int start_mhd(attnd_http *s, char *err, size_t errlen) {
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
        (unsigned)c->http_pollers, MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections,
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

static int ascii_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The API key from the variable server.api_key_env names, when set, without
 * the spaces, tabs, CRs and LFs around it: a key written from a file or a
 * Kubernetes secret often ends in a newline, which no client can send. A
 * variable unset, empty or only blanks means no key. */
static int read_key(attnd_http *s) {
    const char *env = s->cfg->api_key_env;
    const char *key = env && env[0] ? getenv(env) : NULL;
    if (!key || !key[0]) return 0;
    size_t n = strlen(key);
    while (n && ascii_blank(key[n - 1]))
        n--;
    for (; n && ascii_blank(*key); n--)
        key++;
    if (!n) {
        attnd_log(LOG_WARN, "api key: %s holds only blanks; no key is required", env);
        return 0;
    }
    s->api_key = strndup(key, n);
    s->api_key_len = n;
    return s->api_key ? 0 : -1;
}

int attnd_http_start(attnd_http *s, int *listen_failed, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    *listen_failed = 0;
    atomic_init(&s->state, S_STARTING);
    atomic_init(&s->active, 0);
    atomic_init(&s->past_deadline, 0);
    atomic_init(&s->cut, 0);
    atomic_init(&s->buffered, 0);
    if (read_key(s) < 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->guard = attnd_guard_new(c->max_connections, c->header_timeout_ms, c->body_timeout_ms,
                               LINGER_MS, err, errlen);
    if (!s->guard) return -1;
    if (start_mhd(s, err, errlen) < 0) {
        *listen_failed = 1;
        return -1;
    }
    attnd_log(LOG_INFO, "api key: %s; cors: %s", s->api_key ? "required" : "none",
              c->n_cors_origins ? "on" : "off");
    return 0;
}

void attnd_http_quiesce(attnd_http *s) {
    atomic_store(&s->state, S_DRAINING);
    if (!s->mhd) return;
    MHD_socket ls = MHD_quiesce_daemon(s->mhd);
    if (ls != MHD_INVALID_SOCKET) close(ls);
}

void attnd_http_stop(attnd_http *s) {
    atomic_store(&s->state, S_DRAINING);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}

void attnd_http_free(attnd_http *s) {
    attnd_http_stop(s);
    attnd_guard_free(s->guard); /* after the daemon: it closed every connection */
    s->guard = NULL;
    free(s->api_key);
    s->api_key = NULL;
}
