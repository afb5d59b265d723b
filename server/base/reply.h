/* reply.h - what every answer is, before HTTP: each answer a request gets,
 * a success or a refusal, is of one attnd_kind (its name, the reason
 * /metrics counts refusals by, is here; its status and headers are
 * server/http/status.c's). A refusal is an attnd_error (its kind and one
 * sentence), filled by attnd_set_error and made into an answer by
 * attnd_reply_error; its body always carries {"error": "<one sentence>"}. An
 * answer is held as an attnd_reply until it is sent. No HTTP library.
 */
#ifndef ATTND_REPLY_H
#define ATTND_REPLY_H

#include <stddef.h>

typedef enum {
    /* success kinds */
    AOK = 0,        /* 200: the answer */
    AOK_CREATED,    /* 201: a native session open answered with its first step */
    AOK_NO_CONTENT, /* 204: a session deleted (Allow) */
    AOK_PREFLIGHT,  /* 204: a CORS preflight (Allow and the Access-Control-Allow-* headers) */
    AOK_UNCHANGED,  /* 304: the client's copy of a viewer file is current (If-None-Match) */
    /* error kinds, in the order /metrics lists them */
    AERR_BAD_REQUEST,  /* 400: bad JSON, bad tensor, wrong type; names field and index */
    AERR_UNAUTHORIZED, /* 401: missing or wrong API key (WWW-Authenticate: Bearer) */
    AERR_NOT_FOUND,    /* 404: unknown model or route */
    AERR_METHOD,       /* 405: wrong method on a known route (Allow) */
    AERR_TOO_LARGE,    /* 413: body, tokens or attention floats over a limit */
    AERR_QUEUE_FULL,   /* 429: the model's queue is full (Retry-After) */
    AERR_INTERNAL,     /* 500: anything else; the daemon keeps serving */
    AERR_UNAVAILABLE,  /* 503: starting or draining (Retry-After) */
    AERR_TIMEOUT,      /* 504: not done within request_timeout_ms */
    AERR_CONFLICT,     /* 409: a session's previous step is still queued or computing, or its id is
                          taken */
    AERR_FORBIDDEN,    /* 403: a model control route while server.model_control is "none" */
    AERR_NO_ROOM,      /* 507: a model load would pass limits.max_model_bytes */
    ATTND_KINDS
} attnd_kind;

#define AERR_FIRST AERR_BAD_REQUEST /* kinds from here on are refusals */

/* A refusal on its way to the client: the kind and its sentence. */
typedef struct {
    attnd_kind code; /* AOK while nothing is refused */
    char msg[1024];  /* room for a weights file's refusal, which names every tensor */
} attnd_error;

/* An answer, success or refusal, as its holder keeps it until it is sent. */
typedef struct {
    attnd_kind kind;
    char *body;      /* malloc'd and owned unless borrowed; NULL: none (out of memory) */
    size_t len;      /* bytes of body */
    size_t json_len; /* > 0: the body is JSON of this length, then binary tensors (v2) */
    int borrowed;    /* 1: body outlives the answer (a start-up body); never freed here */
} attnd_reply;

/* 1 for a refusal (AERR_FIRST and on). */
int attnd_kind_is_error(attnd_kind k);
/* Short reason for metrics labels: "bad_request", "queue_full", ... ("none"
 * for a success; anything out of range is "internal"). */
const char *attnd_kind_reason(attnd_kind k);

/* Fills e with its kind and a sentence; returns -1, so that parsers can
 * write `return attnd_set_error(...)`. The one way to make a refusal. */
int attnd_set_error(attnd_error *e, attnd_kind code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The one way to answer a refusal: a's kind becomes e's and its body
 * {"error": "..."} (NULL when out of memory). A body a held is freed. */
void attnd_reply_error(attnd_reply *a, const attnd_error *e);
/* The same, for a route whose protocol gives its refusal a body of its
 * own: members (JSON object members without braces, e.g. "\"ready\":false";
 * NULL for none) go before "error", which every refusal keeps: the KServe
 * v2 readiness answers' {"ready": false, "error": "draining"}. */
void attnd_reply_error_with(attnd_reply *a, const attnd_error *e, const char *members);
/* A success of kind k with body (len bytes, json_len as in attnd_reply):
 * a owns body from here on. A body a held is freed. */
void attnd_reply_set(attnd_reply *a, attnd_kind k, char *body, size_t len, size_t json_len);
/* The same with a body that a only borrows (it outlives the answer). */
void attnd_reply_borrow(attnd_reply *a, attnd_kind k, const char *body, size_t len);
/* Hands a's body to the caller (who frees it unless a->borrowed was set)
 * and leaves a without one. */
char *attnd_reply_take(attnd_reply *a);
void attnd_reply_free(attnd_reply *a); /* zeroed replies are fine */

/* {"error": "..."} in a new buffer the caller frees; NULL when out of memory. */
char *attnd_error_body(const char *msg, size_t *len);

#endif
