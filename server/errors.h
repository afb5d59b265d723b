/* errors.h - the one road for errors: every failure a request can meet is
 * one attnd_err, and attnd_err_status() is the only place that turns it into
 * an HTTP status. Bodies are always {"error": "<one sentence>"}.
 */
#ifndef ATTND_ERRORS_H
#define ATTND_ERRORS_H

#include <stddef.h>

typedef enum {
    AERR_NONE = 0,
    AERR_BAD_REQUEST,  /* 400: bad JSON, bad tensor, wrong type; names field and index */
    AERR_UNAUTHORIZED, /* 401: missing or wrong API key (WWW-Authenticate: Bearer) */
    AERR_NOT_FOUND,    /* 404: unknown model or attnd_route */
    AERR_METHOD,       /* 405: wrong method on a known route (Allow) */
    AERR_TOO_LARGE,    /* 413: body, tokens or attention floats over a limit */
    AERR_QUEUE_FULL,   /* 429: the model's queue is full (Retry-After) */
    AERR_INTERNAL,     /* 500: anything else; the daemon keeps serving */
    AERR_UNAVAILABLE,  /* 503: starting or draining (Retry-After) */
    AERR_TIMEOUT,      /* 504: not done within request_timeout_ms */
    AERR_CONFLICT,     /* 409: a session's previous step is still queued or computing, or its id is taken */
    AERR_COUNT
} attnd_err;

/* An error on its way to the client: the kind and its sentence. */
typedef struct {
    attnd_err code;
    char msg[256];
} attnd_error;

int attnd_err_status(attnd_err e);
/* Short reason for metrics labels: "bad_request", "queue_full", ... */
const char *attnd_err_reason(attnd_err e);
/* Sets e and returns -1, so parsers can write `return set_error(...)`. */
int attnd_set_error(attnd_error *e, attnd_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* {"error": "..."} in a new buffer the caller frees; NULL when out of memory. */
char *attnd_error_body(const char *msg, size_t *len);

#endif
