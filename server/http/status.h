/* status.h - an answer's kind (base/reply.h) in HTTP's terms: its status,
 * the headers the kind asks for (Allow, WWW-Authenticate, Retry-After, a
 * CORS preflight's), and the whole list of headers an answer carries, in
 * the order they go out (the same for every answer: X-Request-Id,
 * traceparent, Server-Timing, Cache-Control, CORS, Connection). send.c is the one
 * place that turns these into bytes on a connection; this file writes
 * none and knows no HTTP library.
 */
#ifndef ATTND_STATUS_H
#define ATTND_STATUS_H

#include <stddef.h>

#include "../base/reply.h"
#include "../ui/ui.h"

/* The headers an answer of some kind carries besides those every answer
 * has (attnd_kind_headers). */
enum {
    ATTND_HDR_ALLOW = 1,        /* Allow: the route's methods */
    ATTND_HDR_AUTHENTICATE = 2, /* WWW-Authenticate: Bearer */
    ATTND_HDR_RETRY_AFTER = 4,  /* Retry-After: seconds */
    ATTND_HDR_PREFLIGHT = 8     /* the CORS preflight's own headers, and none that
                                   describe an answer (Cache-Control, Expose-Headers) */
};

int attnd_kind_status(attnd_kind k); /* anything out of range: 500 */
/* The ATTND_HDR_* bits of k. */
unsigned attnd_kind_headers(attnd_kind k);

/* What an answer's headers say, besides its status and its body. */
typedef struct {
    unsigned extra;          /* ATTND_HDR_* bits: the kind's (attnd_kind_headers) */
    const char *ctype;       /* Content-Type, or NULL (an empty body) */
    const char *request_id;  /* X-Request-Id */
    const char *traceparent; /* the answer's traceparent (obs/trace.h), or NULL: none */
    double queue_ms;         /* Server-Timing: admission to compute start */
    double compute_ms;       /* Server-Timing: the batch's compute */
    double total_ms;         /* Server-Timing: first byte to now */
    int cors;                /* 1: CORS is on (Vary: Origin) */
    const char *origin;      /* an allowed Origin to echo, or NULL */
    const char *allow;       /* the route's methods (Allow, Access-Control-Allow-Methods) */
    int retry_after;         /* Retry-After seconds; 0 means 1 */
    size_t json_len;         /* > 0: Inference-Header-Content-Length (v2 binary outputs) */
    const char *session_id;  /* X-Session-Id: the session a step or restore answered for, or NULL */
    int close;               /* 1: Connection: close */
    const attnd_ui_file *ui; /* a viewer file answered: its own caching and protection
                                headers (ui.h) instead of Cache-Control: no-store; or NULL */
} attnd_answer_meta;

#define ATTND_HEADERS_MAX 24

/* One header line. */
typedef struct {
    const char *name;
    char value[160];
} attnd_header;

/* The headers of an answer described by m, in order, into out (room for
 * ATTND_HEADERS_MAX); returns how many. */
int attnd_answer_headers(const attnd_answer_meta *m, attnd_header *out);

#endif
