/* http.h - attnd's HTTP side: libmicrohttpd, the route table, the guard,
 * and what they share. The server's life (server/server.c) fills the
 * borrowed fields of an attnd_http, starts it (attnd_http_start), hands the
 * scheduler its two callbacks, and drains and stops it.
 *
 * HTTP threads parse, check and queue; they never compute and never wait
 * for a worker: a request waiting for compute has its connection
 * suspended. Inside, top down (calls only go down): glue.c
 * (libmicrohttpd's callbacks: a request walks route -> auth -> body ->
 * handler), routes.c (the route table and its matcher), handlers.c (one
 * function per route), send.c (the one function every answer leaves
 * through), hreq.c (helpers on a request), then route.h (the route types),
 * status.c and guard.c.
 */
#ifndef ATTND_HTTP_H
#define ATTND_HTTP_H

#include <stdatomic.h>
#include <stddef.h>

#include "../../config/config.h"
#include "../batch/req.h"
#include "../batch/sched.h"
#include "../body/meta.h"
#include "../body/request.h"
#include "../obs/metrics.h"
#include "../obs/otlp.h"
#include "../session/session.h"
#include "guard.h"

enum { S_STARTING = 0, S_READY = 1, S_DRAINING = 2 };

typedef struct attnd_http {
    /* given by the server's life before attnd_http_start; borrowed */
    const attnd_config *cfg;
    const attnd_parse_env *env; /* the served models and the limits */
    attnd_sched *sched;
    attnd_sessions *sessions;
    attnd_metrics *metrics;
    const attnd_meta *meta; /* the bodies of GET /v1/models, /v2, /v2/models/{name} */
    attnd_otlp *otlp;       /* the span exporter (tracing.otlp_endpoint), or NULL: none */
    /* more of GET /metrics: the gRPC side's calls (or NULL) */
    void (*more_metrics)(attnd_sbuf *b, void *arg);
    void *more_metrics_arg;
    /* its own */
    attnd_guard *guard; /* connection slots and read deadlines */
    struct MHD_Daemon *mhd;
    int port;
    char *api_key; /* NULL = no key needed; owned copy of the env value */
    size_t api_key_len;
    atomic_int state;         /* S_STARTING, S_READY, S_DRAINING */
    atomic_long active;       /* requests between their first byte and completion */
    atomic_int past_deadline; /* 1: the drain deadline passed; answers now are cut */
    atomic_int cut;           /* requests cut short at the drain deadline */
    atomic_llong buffered;    /* request body bytes held now, over every connection */
} attnd_http;

/* Reads the API key, starts the guard and listens on cfg's host and port
 * (the borrowed fields set; state S_STARTING until the caller makes it
 * S_READY). Returns 0; -1 with err set, *listen_failed 1 when the address
 * was the trouble. */
int attnd_http_start(attnd_http *s, int *listen_failed, char *err, size_t errlen);
/* Draining: new connections refused, /health 503, requests on open
 * connections 503. */
void attnd_http_quiesce(attnd_http *s);
/* Stops libmicrohttpd (every connection closed); suspended connections
 * must all have been resumed (the scheduler stopped). */
void attnd_http_stop(attnd_http *s);
/* Stops, then frees what s owns. Zeroed is fine. */
void attnd_http_free(attnd_http *s);

/* The scheduler's callbacks (attnd_sched_opts), arg the attnd_http: a
 * queued request's reply is ready (its connection resumes), and which
 * queued requests' clients left (requests of another side, r->proto, are
 * never said to have left: that side cancels its own). */
void attnd_http_answer_ready(attnd_req *r, void *arg);
void attnd_http_departed(attnd_req *const *rs, int n, char *left, void *arg);

#endif
