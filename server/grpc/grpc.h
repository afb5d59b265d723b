/* grpc.h - attnd's gRPC side: the Open Inference Protocol's
 * inference.GRPCInferenceService and grpc.health.v1.Health on
 * server.grpc_port, over gRPC's C core (libgrpc, Debian's; docs/api.md,
 * "gRPC"). The server's life (server/server.c) fills the borrowed fields,
 * starts it beside the HTTP side, drains and stops it with that side.
 *
 * One thread polls the completion queue: calls arrive, their messages are
 * read into the same jobs as the HTTP v2 route's (wire.c), admitted and
 * queued on the same scheduler; the worker that answers a job writes its
 * message and starts the send from its own thread. The unary calls that
 * only describe are answered on the polling thread (calls.c). Inside, top
 * down: serve.c (calls, streams, the scheduler's callback), call.c (a
 * call's state, references, metadata and access log line), calls.c (the
 * describing and repository calls), wire.c (messages as v2 bodies).
 */
#ifndef ATTND_GRPC_H
#define ATTND_GRPC_H

#include <pthread.h>
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

/* The methods served, by their index in /metrics and the access log. */
enum {
    GM_LIVE = 0,
    GM_READY,
    GM_MODEL_READY,
    GM_SERVER_METADATA,
    GM_MODEL_METADATA,
    GM_INFER,
    GM_STREAM_INFER,
    GM_REPO_INDEX,
    GM_REPO_LOAD,
    GM_REPO_UNLOAD,
    GM_HEALTH_CHECK,
    GM_HEALTH_WATCH,
    GM_UNKNOWN, /* any other method: UNIMPLEMENTED */
    GM_COUNT
};

typedef struct attnd_grpc {
    /* given by the server's life before attnd_grpc_start; borrowed */
    const attnd_config *cfg;
    const attnd_parse_env *env;
    attnd_sched *sched;
    attnd_sessions *sessions;
    attnd_metrics *metrics;
    const attnd_meta *meta;
    attnd_otlp *otlp;
    const atomic_int *state; /* the HTTP side's (http.h S_*): one readiness for both */
    const char *api_key;     /* NULL: no key; the HTTP side's copy */
    size_t api_key_len;
    /* its own */
    struct grpc_server *server;
    struct grpc_completion_queue *cq;
    pthread_t poller;
    int running;                               /* the poller started */
    int port;                                  /* bound; 0 when off */
    atomic_long active;                        /* calls between arrival and their end */
    atomic_int shutting;                       /* 1: no new calls are asked for */
    atomic_uint_least64_t calls[GM_COUNT][17]; /* by method and status code */
    atomic_uint_least64_t merged;              /* stream messages answered from a merged step */
    pthread_mutex_t watch_mu;                  /* over watchers */
    struct gcall *watchers;                    /* the Health/Watch calls open */
} attnd_grpc;

/* Listens on cfg's host and grpc_port and starts the poller; nothing when
 * grpc_port is 0. Returns 0; -1 with err set, *listen_failed 1 when the
 * address was the trouble. */
int attnd_grpc_start(attnd_grpc *g, int *listen_failed, char *err, size_t errlen);
/* There is no quiesce: while the server drains (*state S_DRAINING) calls
 * are still taken, and those that compute are answered UNAVAILABLE "the
 * server is draining", as HTTP requests on open connections get 503; a
 * call that arrived before the drain is answered. */
/* Takes no more calls, cancels what is left (idle streams), joins the
 * poller, frees gRPC's side. The scheduler must be stopped first. Zeroed
 * and stopped are fine. */
void attnd_grpc_stop(attnd_grpc *g);

/* The server's readiness (*state) changed: each grpc.health.v1 Watch call
 * open is sent its new status. Any thread; nothing when gRPC is off. */
void attnd_grpc_health_changed(attnd_grpc *g);

/* The scheduler's finish callback for a request that came over gRPC
 * (r->proto == ATTND_PROTO_GRPC): its answer is written and sent. */
void attnd_grpc_answer_ready(attnd_req *r);

/* attnd_grpc_calls_total{method,code}: the calls answered, into b. */
void attnd_grpc_metrics(const attnd_grpc *g, attnd_sbuf *b);

#endif
