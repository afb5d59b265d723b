/* server.c - the server's life (server.h): start (the models, the bodies
 * that describe them, the session table, the scheduler, the HTTP side),
 * drain, free. What each part does is its own folder's: server/http/,
 * server/batch/, server/body/, server/obs/.
 */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/attn.h"
#include "base/clock.h"
#include "batch/sched.h"
#include "body/meta.h"
#include "body/request.h"
#include "grpc/grpc.h"
#include "http/http.h"
#include "http/routes.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "obs/otlp.h"
#include "reload.h"
#include "session/persist.h"
#include "session/session.h"
#include "session/state.h"

struct attnd_server {
    const attnd_config *cfg;  /* borrowed; outlives the server */
    attnd_models *models;     /* the models and their versions */
    attnd_applied applied;    /* the config file's models as last applied (SIGHUP) */
    attnd_parse_env env;      /* what the readers check bodies against */
    attnd_meta meta;          /* the bodies of the routes that describe the server */
    attnd_sessions *sessions; /* KV-cache sessions */
    attnd_sched *sched;       /* the queues, the batcher and the compute pool */
    attnd_metrics metrics;
    attnd_otlp *otlp; /* span export (tracing.otlp_endpoint), or NULL */
    attnd_http http;  /* libmicrohttpd and the routes */
    attnd_grpc grpc;  /* gRPC's C core and the Open Inference Protocol's service */
};

/* Loads every model of the config (the registry logs each). */
static int load_models(attnd_server *s, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    if (attn_set_bf16_kernels(c->bf16_kernels) < 0) { /* a word of the config's table */
        snprintf(err, errlen, "unknown bf16 kernels \"%s\"", c->bf16_kernels);
        return -1;
    }
    if (attn_set_int8_kernels(c->int8_kernels) < 0) {
        snprintf(err, errlen, "unknown int8 kernels \"%s\"", c->int8_kernels);
        return -1;
    }
    if (!(s->models = attnd_models_new(c->max_model_bytes))) {
        snprintf(err, errlen, "out of memory loading models");
        return -1;
    }
    for (int i = 0; i < c->n_models; i++) {
        attnd_error e = {AOK, ""};
        int version;
        if (attnd_models_load(s->models, &c->models[i], 0, &version, &e) < 0) {
            err[0] = '\0'; /* the registry logged it, in one line */
            return -1;
        }
    }
    s->env = (attnd_parse_env){.models = s->models,
                               .max_tokens_per_request = c->max_tokens_per_request,
                               .max_attention_floats = c->max_attention_floats};
    if (attnd_applied_init(&s->applied, c) < 0) {
        snprintf(err, errlen, "out of memory loading models");
        return -1;
    }
    return 0;
}

/* The version a session was opened on, for a v2 step (attnd_parse_env). */
static attnd_version *session_version(void *arg, const char *id) {
    return attnd_session_model(arg, id, attnd_mono_s());
}

/* A session holds the version it was opened on (session.h's hooks). */
static void hold_version(void *v) {
    attnd_version_ref(v);
}

static void drop_version(void *v) {
    attnd_version_unref(v);
}

/* The scheduler's finish callback: the side a request came from sends
 * its answer. */
static void answer_ready(attnd_req *r, void *arg) {
    attnd_server *s = arg;
    if (r->proto == ATTND_PROTO_GRPC)
        attnd_grpc_answer_ready(r);
    else
        attnd_http_answer_ready(r, &s->http);
}

static void grpc_metrics(attnd_sbuf *b, void *arg) {
    attnd_grpc_metrics(arg, b);
}

/* The session table with its reaper, and the scheduler whose callbacks
 * are the two sides'. */
static int start_compute(attnd_server *s, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    attnd_session_limits sl = {c->max_sessions, c->max_session_bytes, c->max_session_bytes_each,
                               c->session_idle_s};
    s->sessions = attnd_sessions_new(&sl);
    if (!s->sessions || attnd_sessions_reaper_start(s->sessions, attnd_mono_s) < 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    attnd_sessions_hooks(s->sessions, hold_version, drop_version);
    s->env.session_version = session_version;
    s->env.session_arg = s->sessions;
    attnd_sched_opts o = {c, &s->metrics, answer_ready, s, attnd_http_departed, &s->http};
    s->sched = attnd_sched_new(&o, err, errlen);
    return s->sched ? 0 : -1;
}

/* The span exporter, when tracing.otlp_endpoint is set: a queue of
 * tracing.queue_spans spans, batches of up to 512 sent every second at
 * most, a POST given 5 s, 2 s at shutdown to send what is left. */
static int start_tracing(attnd_server *s, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    if (!c->otlp_endpoint) return 0;
    attnd_otlp_opts o = {.endpoint = c->otlp_endpoint,
                         .queue_spans = c->otlp_queue_spans,
                         .batch_max = c->otlp_queue_spans < 512 ? c->otlp_queue_spans : 512,
                         .interval_ms = 1000,
                         .timeout_ms = 5000,
                         .shutdown_ms = 2000,
                         .fail_log_s = 60,
                         .service_version = ATTND_VERSION};
    s->otlp = attnd_otlp_new(&o, err, errlen);
    if (!s->otlp) return -1;
    attnd_log(LOG_INFO, "tracing: spans exported to %s (OTLP/HTTP JSON, queue of %d spans)",
              c->otlp_endpoint, c->otlp_queue_spans);
    return 0;
}

/* The gRPC side beside the HTTP one: the same queue, sessions, models,
 * key and readiness. */
static int start_grpc(attnd_server *s, int *listen_failed, char *err, size_t errlen) {
    s->grpc = (attnd_grpc){.cfg = s->cfg,
                           .env = &s->env,
                           .sched = s->sched,
                           .sessions = s->sessions,
                           .metrics = &s->metrics,
                           .meta = &s->meta,
                           .otlp = s->otlp,
                           .state = &s->http.state,
                           .api_key = s->http.api_key,
                           .api_key_len = s->http.api_key_len};
    return attnd_grpc_start(&s->grpc, listen_failed, err, errlen);
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
    int listen_failed = 0;
    /* The HTTP port opens first, so that a probe hears 503 "starting" while
     * the models load (the health routes alone are answered: glue.c); what
     * a request reads of the models, the queue and the sessions is set
     * before the state turns S_READY, which every reader checks first. */
    if (start_tracing(s, err, errlen) < 0) goto fail;
    s->http = (attnd_http){.cfg = cfg,
                           .env = &s->env,
                           .metrics = &s->metrics,
                           .meta = &s->meta,
                           .otlp = s->otlp,
                           .more_metrics = grpc_metrics,
                           .more_metrics_arg = &s->grpc};
    if (attnd_http_start(&s->http, &listen_failed, err, errlen) < 0) {
        if (listen_failed) *why = ATTND_EXIT_LISTEN;
        goto fail;
    }
    if (load_models(s, err, errlen) < 0) {
        *why = ATTND_EXIT_WEIGHTS;
        goto fail;
    }
    if (attnd_meta_build(&s->meta) < 0 || attnd_models_start(s->models) < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (start_compute(s, err, errlen) < 0) goto fail;
    if (cfg->save_dir && attnd_save_dir_ready(cfg->save_dir, err, errlen) < 0) {
        *why = ATTND_EXIT_CONFIG;
        goto fail;
    }
    if (cfg->save_dir)
        attnd_sessions_load(&(attnd_persist_env){s->sessions, &s->env}, cfg->save_dir,
                            attnd_mono_s());
    s->http.sched = s->sched;
    s->http.sessions = s->sessions;
    if (start_grpc(s, &listen_failed, err, errlen) < 0) {
        if (listen_failed) *why = ATTND_EXIT_LISTEN;
        goto fail;
    }
    atomic_store(&s->http.state, S_READY);
    attnd_grpc_health_changed(&s->grpc);
    return s;
fail:
    attnd_server_free(s);
    return NULL;
}

void attnd_server_reload(attnd_server *s) {
    attnd_reload(s->cfg, s->models, &s->applied);
}

int attnd_server_port(const attnd_server *s) {
    return s->http.port;
}

int attnd_server_grpc_port(const attnd_server *s) {
    return s->grpc.port;
}

static int idle(attnd_server *s) {
    return atomic_load(&s->http.active) == 0 && atomic_load(&s->grpc.active) == 0 &&
           attnd_sched_pending(s->sched) == 0;
}

int attnd_server_drain(attnd_server *s) {
    attnd_http_quiesce(&s->http); /* the gRPC side reads the same state */
    attnd_grpc_health_changed(&s->grpc);
    attnd_sched_drain(s->sched);
    uint64_t limit = attnd_mono_us() + (uint64_t)s->cfg->drain_grace_s * 1000000u;
    /* idle twice, 20 ms apart: a request whose header lines were on their
     * way on a connection already open is answered (503) before the stop,
     * rather than closed unanswered by it */
    for (;;) {
        while (attnd_mono_us() < limit && !idle(s))
            usleep(2000);
        if (attnd_mono_us() >= limit) break;
        usleep(20000);
        if (idle(s)) break;
    }
    if (!idle(s)) {
        /* what is answered from here on is cut: queued work gets 503 now,
         * running batches finish, and stopping the daemon closes every
         * connection still sending (each logged when it completes) */
        long active = atomic_load(&s->http.active);
        atomic_store(&s->http.past_deadline, 1);
        attnd_log(LOG_WARN, "drain deadline of %d s passed with %ld request%s unfinished",
                  s->cfg->drain_grace_s, active, active == 1 ? "" : "s");
        attnd_sched_abort_queued(s->sched);
    }
    /* suspended connections must all be resumed before libmicrohttpd stops:
     * the loads asked for over HTTP are answered, the queues emptied */
    attnd_models_stop(s->models);
    attnd_sched_stop(s->sched);
    attnd_http_stop(&s->http);
    attnd_grpc_stop(&s->grpc);
    /* no request left, no step running: every session is as its last answer left it */
    if (s->cfg->save_dir)
        attnd_sessions_save(&(attnd_persist_env){s->sessions, &s->env}, s->cfg->save_dir,
                            attnd_mono_s());
    return atomic_load(&s->http.cut);
}

void attnd_server_free(attnd_server *s) {
    if (!s) return;
    atomic_store(&s->http.state, S_DRAINING);
    attnd_models_stop(s->models);
    attnd_sched_stop(s->sched);
    attnd_http_free(&s->http); /* every connection closed */
    attnd_grpc_stop(&s->grpc); /* every call over */
    attnd_otlp_free(s->otlp);  /* after the last request's spans: sends what is queued */
    attnd_sched_free(s->sched);
    attnd_sessions_free(s->sessions); /* after the HTTP side: no request holds a step */
    attnd_models_free(s->models);     /* after the sessions: none holds a version */
    attnd_applied_free(&s->applied);
    attnd_meta_free(&s->meta);
    free(s);
}
