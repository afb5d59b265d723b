/* status.c - kinds to statuses and headers (status.h). */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

/* One line per kind: its status and the headers it asks for. */
// clang-format off
static const struct {
    int status;
    unsigned headers;
} KINDS[ATTND_KINDS] = {
    [AOK]               = {200, 0},
    [AOK_CREATED]       = {201, 0},
    [AOK_NO_CONTENT]    = {204, ATTND_HDR_ALLOW},
    [AOK_PREFLIGHT]     = {204, ATTND_HDR_ALLOW | ATTND_HDR_PREFLIGHT},
    [AOK_UNCHANGED]     = {304, 0},
    [AERR_BAD_REQUEST]  = {400, 0},
    [AERR_UNAUTHORIZED] = {401, ATTND_HDR_AUTHENTICATE},
    [AERR_NOT_FOUND]    = {404, 0},
    [AERR_METHOD]       = {405, ATTND_HDR_ALLOW},
    [AERR_TOO_LARGE]    = {413, 0},
    [AERR_QUEUE_FULL]   = {429, ATTND_HDR_RETRY_AFTER},
    [AERR_INTERNAL]     = {500, 0},
    [AERR_UNAVAILABLE]  = {503, ATTND_HDR_RETRY_AFTER},
    [AERR_TIMEOUT]      = {504, 0},
    [AERR_CONFLICT]     = {409, 0},
    [AERR_FORBIDDEN]    = {403, 0},
    [AERR_NO_ROOM]      = {507, 0},
};
// clang-format on

/* Anything out of range is an internal failure. */
static attnd_kind known(attnd_kind k) {
    return (unsigned)k < ATTND_KINDS ? k : AERR_INTERNAL;
}

int attnd_kind_status(attnd_kind k) {
    return KINDS[known(k)].status;
}

unsigned attnd_kind_headers(attnd_kind k) {
    return KINDS[known(k)].headers;
}

/* Appends a header whose value is printed from fmt; returns the count. */
__attribute__((format(printf, 4, 5))) static int put(attnd_header *out, int n, const char *name,
                                                     const char *fmt, ...) {
    if (n >= ATTND_HEADERS_MAX) return n;
    va_list ap;
    va_start(ap, fmt);
    out[n].name = name;
    vsnprintf(out[n].value, sizeof out[n].value, fmt, ap);
    va_end(ap);
    return n + 1;
}

/* The CORS headers for an allowed origin: a preflight's answer, or what
 * the page may read of any other. */
static int cors(const attnd_answer_meta *m, attnd_header *out, int n) {
    n = put(out, n, "Access-Control-Allow-Origin", "%s", m->origin);
    if (!(m->extra & ATTND_HDR_PREFLIGHT))
        return put(out, n, "Access-Control-Expose-Headers",
                   "X-Request-Id, traceparent, Server-Timing, Retry-After, X-Session-Id");
    n = put(out, n, "Access-Control-Allow-Methods", "%s", m->allow);
    n = put(out, n, "Access-Control-Allow-Headers",
            "Authorization, Content-Type, X-Request-Id, traceparent, tracestate, "
            "Request-Timeout-Ms, X-Session-Id");
    return put(out, n, "Access-Control-Max-Age", "600");
}

int attnd_answer_headers(const attnd_answer_meta *m, attnd_header *out) {
    int n = 0, preflight = (m->extra & ATTND_HDR_PREFLIGHT) != 0;
    if (m->ctype) n = put(out, n, "Content-Type", "%s", m->ctype);
    n = put(out, n, "X-Request-Id", "%s", m->request_id);
    if (m->traceparent) n = put(out, n, "traceparent", "%s", m->traceparent);
    n = put(out, n, "Server-Timing", "queue;dur=%.3f, compute;dur=%.3f, total;dur=%.3f",
            m->queue_ms, m->compute_ms, m->total_ms);
    const char *un, *uv;
    for (int i = 0; m->ui && attnd_ui_header(m->ui, i, &un, &uv); i++)
        n = put(out, n, un, "%s", uv); /* its caching and its page's policy */
    if (!preflight && !m->ui) n = put(out, n, "Cache-Control", "no-store");
    if (m->cors) n = put(out, n, "Vary", "Origin");
    if (m->json_len) n = put(out, n, "Inference-Header-Content-Length", "%zu", m->json_len);
    if (m->session_id) n = put(out, n, "X-Session-Id", "%s", m->session_id);
    if (m->origin) n = cors(m, out, n);
    if (m->extra & ATTND_HDR_ALLOW) n = put(out, n, "Allow", "%s", m->allow);
    if (m->extra & ATTND_HDR_AUTHENTICATE)
        n = put(out, n, "WWW-Authenticate", "Bearer realm=\"attnd\"");
    if (m->extra & ATTND_HDR_RETRY_AFTER)
        n = put(out, n, "Retry-After", "%d", m->retry_after > 0 ? m->retry_after : 1);
    if (m->close) n = put(out, n, "Connection", "close");
    return n;
}
