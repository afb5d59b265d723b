/* hreq.h - one HTTP request inside the HTTP side, and the helpers on it
 * (hreq.c: its headers, a header's size, its body's bytes) that glue.c,
 * handlers.c and send.c share. Not for other parts: they see attnd_req
 * (batch/req.h), which is its first member.
 */
#ifndef ATTND_HREQ_H
#define ATTND_HREQ_H

#include <microhttpd.h>
#include <stdint.h>

#include "../base/buffer.h"
#include "../base/reply.h"
#include "../batch/req.h"
#include "../obs/trace.h"
#include "../ui/ui.h"
#include "guard.h"
#include "http.h"
#include "route.h"

enum { P_HEADERS = 0, P_BODY, P_WAIT, P_SENT };

/* X-Request-Id: 1 to 128 characters and the NUL. */
#define ATTND_REQUEST_ID_MAX 129

/* One connection: libmicrohttpd's socket context for it, from its start to
 * its close (glue.c, on_connection). */
typedef struct {
    guard_conn *gc;     /* its record in the guard, or NULL */
    const char *req_id; /* the X-Request-Id of its request being read, or NULL before the
                           header lines are in */
    /* a request that libmicrohttpd refused itself while reading it (a bad
     * chunk, or before its header lines were in: 414, 431, 505, a bad
     * Content-Length), as send.c answered it; refused 0 = none */
    int refused;
    size_t refused_bytes;
    char refused_id[ATTND_REQUEST_ID_MAX];
} hconn;

/* One HTTP request: the scheduler's job (r) and what the HTTP side keeps
 * for it. Lives from the first handler call to the completion callback
 * and, when queued, until the scheduler lets go (refcounted in r). */
typedef struct attnd_http_req {
    attnd_req r; /* first member: the job, its times and its reply */
    attnd_http *srv;
    struct MHD_Connection *conn;
    attnd_route_match rm; /* route, captures, Allow */
    attnd_route_id rid;   /* for metrics; R_UNKNOWN when no route */
    char method[12];
    char path[160];                /* for the access log, control characters replaced */
    char id[ATTND_REQUEST_ID_MAX]; /* X-Request-Id */
    const char *origin;            /* allowed CORS origin to echo (MHD-owned header), or NULL */
    uint64_t t_recv_us;            /* first handler call */
    int phase;                     /* P_HEADERS, P_BODY, P_WAIT (suspended), P_SENT */
    attnd_error err;               /* its refusal, decided before the body was read or by its
                                      handler; AOK while there is none */
    attnd_sbuf in;                 /* the body */
    long long in_held;             /* bytes of it counted in srv->buffered */
    int refuse_now;                /* 1: err was decided at the header lines (413, 429): the
                                      body is never kept, and the connection closes after
                                      the answer, sent at once or once the body was read
                                      and dropped (glue.c, LINGER_BYTES) */
    long long in_total;            /* body bytes received, kept or not */
    int submitted;                 /* 1: handed to the scheduler */
    int sock;                /* client socket while queued (asked whether the client left), or -1 */
    int gone;                /* 1: its client left while queued: close, do not answer */
    const char *ctype;       /* Content-Type of a success that is not JSON (metrics), or NULL */
    int status;              /* status sent, 0 before */
    attnd_kind sent;         /* kind of the answer sent */
    size_t sent_bytes;       /* body bytes of the answer */
    int late;                /* 1: its queued work was dropped at the drain deadline */
    hconn *hc;               /* its connection, or NULL */
    guard_conn *gc;          /* its connection's record in the guard, or NULL */
    int retry_after;         /* Retry-After seconds of a 429, 0 = the default 1 */
    const attnd_ui_file *ui; /* the viewer's file it answers (its own headers), or NULL */
    attnd_trace trace;       /* its place in a trace: the caller's traceparent continued, or a
                                new trace; its own span id (obs/trace.h) */
    uint64_t t_recv_unix_ns; /* Unix time of t_recv_us, for its spans */
    char model[ATTND_NAME_MAX]; /* the model its body named, once parsed; "" before or none */
    struct hvalue *values;      /* header values it read that ended in blanks, trimmed copies
                                   (attnd_http_header), freed with it */
} hreq;

/* send.c: every answer leaves through here, h->r.reply with the status of
 * its kind and the headers of status.c. */
enum MHD_Result attnd_http_send(hreq *h);
/* send.c: the one maker of request ids: the client's X-Request-Id when it
 * is sane (1 to 128 visible ASCII characters but `"` and `\`), else a new
 * one (16 hex digits). Returns 1 when the client's was taken. given may be
 * NULL. */
int attnd_http_request_id(const char *given, char out[ATTND_REQUEST_ID_MAX]);

/* hreq.c: frees the body read so far and gives its bytes back to the
 * budget. */
void attnd_http_drop_body(hreq *h);
/* hreq.c: a header's decimal size: digits only (no sign, no spaces), at
 * most limit. Returns 0, or -1 with *v untouched. */
int attnd_http_size(const char *s, uint64_t limit, uint64_t *v);
/* hreq.c: the value of request header name without the spaces and tabs
 * that end it (RFC 9110, 5.5: not part of the value; libmicrohttpd drops
 * the leading ones), or NULL. Valid while h lives. */
const char *attnd_http_header(hreq *h, const char *name);
/* Frees the trimmed copies attnd_http_header made. */
void attnd_http_free_values(hreq *h);

#endif
