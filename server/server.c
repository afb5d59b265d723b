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
#include "http/http.h"
#include "http/routes.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "obs/otlp.h"
#include "session/persist.h"
#include "session/session.h"
#include "session/state.h"

struct attnd_server {
    const attnd_config *cfg; /* borrowed; outlives the server */
    attn_model *models;      /* (n_models) loaded weights, owned */
    attnd_model_info *info;  /* (n_models) names and hyper-parameters as loaded */
    char (*fingerprints)[ATTND_FINGERPRINT_LEN + 1]; /* (n_models) info's fingerprints */
    int n_models;
    attnd_parse_env env;      /* what the readers check bodies against */
    attnd_meta meta;          /* the bodies of the routes that describe the server */
    attnd_sessions *sessions; /* KV-cache sessions */
    attnd_sched *sched;       /* the queues, the batcher and the compute pool */
    attnd_metrics metrics;
    attnd_otlp *otlp; /* span export (tracing.otlp_endpoint), or NULL */
    attnd_http http;  /* libmicrohttpd and the routes */
};

/* For a model that asks for bf16, one line: the kernels it computes with,
 * or why it computes in fp32. */
static void log_precision(const attnd_model_config *mc, const attn_model *m) {
    if (m->hp.precision != ATTN_BF16) return;
    if (m->precision == ATTN_BF16)
        attnd_log(LOG_INFO, "model %s: precision bf16 on %s kernels, attention in %s%s", mc->name,
                  attn_bf16_kernels(), m->attn16 ? "bf16" : "fp32",
                  m->attn16 ? "" : " (its head width has no bf16 attention kernel)");
    else if (strcmp(attn_bf16_cpu_kernels(), "none") == 0)
        attnd_log(LOG_WARN,
                  "model %s: precision bf16 asked for, but this CPU has neither AVX512-BF16 nor "
                  "AMX-BF16: it computes in fp32",
                  mc->name);
    else
        attnd_log(LOG_WARN,
                  "model %s: precision bf16 asked for, but workers.bf16_kernels is \"none\": it "
                  "computes in fp32",
                  mc->name);
}

/* Loads every model of the config, logging each. */
static int load_models(attnd_server *s, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    if (attn_set_bf16_kernels(c->bf16_kernels) < 0) { /* a word of the config's table */
        snprintf(err, errlen, "unknown bf16 kernels \"%s\"", c->bf16_kernels);
        return -1;
    }
    s->n_models = c->n_models; /* zeroed models are safe to free */
    s->models = calloc((size_t)c->n_models, sizeof(attn_model));
    s->info = calloc((size_t)c->n_models, sizeof(attnd_model_info));
    s->fingerprints = calloc((size_t)c->n_models, sizeof *s->fingerprints);
    if (!s->models || !s->info || !s->fingerprints) {
        snprintf(err, errlen, "out of memory loading models");
        return -1;
    }
    for (int i = 0; i < c->n_models; i++) {
        const attnd_model_config *mc = &c->models[i];
        if (attnd_model_load(&s->models[i], mc, err, errlen) < 0) return -1;
        const attn_model *m = &s->models[i];
        const attn_hparams *hp = &m->hp;
        attnd_weights_fingerprint(m, s->fingerprints[i]); /* for state files */
        s->info[i] =
            (attnd_model_info){mc->name,     *hp,       mc->max_positions,  s->fingerprints[i],
                               m->precision, m->attn16, attn_model_bytes(m)};
        attnd_log(LOG_INFO,
                  "model %s: embed_dim=%d num_heads=%d kdim=%d vdim=%d bias=%s causal=%s "
                  "precision=%s weights=%s (%zu bytes)",
                  mc->name, hp->embed_dim, hp->num_heads, hp->kdim, hp->vdim,
                  hp->bias ? "true" : "false", hp->causal ? "true" : "false",
                  attnd_enum_name(&attnd_precisions, hp->precision),
                  mc->weights ? mc->weights : "embedded default (fixed seed)", attn_model_bytes(m));
        log_precision(mc, m);
    }
    s->env =
        (attnd_parse_env){s->info, s->n_models, c->max_tokens_per_request, c->max_attention_floats};
    return 0;
}

/* The session table with its reaper, and the scheduler whose callbacks
 * are the HTTP side's. */
static int start_compute(attnd_server *s, char *err, size_t errlen) {
    const attnd_config *c = s->cfg;
    attnd_session_limits sl = {c->max_sessions, c->max_session_bytes, c->max_session_bytes_each,
                               c->session_idle_s};
    s->sessions = attnd_sessions_new(&sl);
    if (!s->sessions || attnd_sessions_reaper_start(s->sessions, attnd_mono_s) < 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    attnd_sched_opts o = {c,           s->models,           s->info,
                          s->n_models, &s->metrics,         attnd_http_answer_ready,
                          &s->http,    attnd_http_departed, &s->http};
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
    if (load_models(s, err, errlen) < 0) {
        *why = ATTND_EXIT_WEIGHTS;
        goto fail;
    }
    if (attnd_meta_build(&s->meta, cfg, s->info, s->n_models) < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (start_compute(s, err, errlen) < 0 || start_tracing(s, err, errlen) < 0) goto fail;
    if (cfg->save_dir && attnd_save_dir_ready(cfg->save_dir, err, errlen) < 0) {
        *why = ATTND_EXIT_CONFIG;
        goto fail;
    }
    if (cfg->save_dir)
        attnd_sessions_load(&(attnd_persist_env){s->sessions, &s->env}, cfg->save_dir,
                            attnd_mono_s());
    s->http = (attnd_http){.cfg = cfg,
                           .env = &s->env,
                           .sched = s->sched,
                           .sessions = s->sessions,
                           .metrics = &s->metrics,
                           .meta = &s->meta,
                           .otlp = s->otlp};
    if (attnd_http_start(&s->http, &listen_failed, err, errlen) < 0) {
        if (listen_failed) *why = ATTND_EXIT_LISTEN;
        goto fail;
    }
    atomic_store(&s->http.state, S_READY);
    return s;
fail:
    attnd_server_free(s);
    return NULL;
}

int attnd_server_port(const attnd_server *s) {
    return s->http.port;
}

static int idle(attnd_server *s) {
    return atomic_load(&s->http.active) == 0 && attnd_sched_pending(s->sched) == 0;
}

int attnd_server_drain(attnd_server *s) {
    attnd_http_quiesce(&s->http);
    attnd_sched_drain(s->sched);
    uint64_t limit = attnd_mono_us() + (uint64_t)s->cfg->drain_grace_s * 1000000u;
    while (attnd_mono_us() < limit && !idle(s))
        usleep(2000);
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
    /* suspended connections must all be resumed before libmicrohttpd stops */
    attnd_sched_stop(s->sched);
    attnd_http_stop(&s->http);
    /* no request left, no step running: every session is as its last answer left it */
    if (s->cfg->save_dir)
        attnd_sessions_save(&(attnd_persist_env){s->sessions, &s->env}, s->cfg->save_dir,
                            attnd_mono_s());
    return atomic_load(&s->http.cut);
}

void attnd_server_free(attnd_server *s) {
    if (!s) return;
    atomic_store(&s->http.state, S_DRAINING);
    attnd_sched_stop(s->sched);
    attnd_http_free(&s->http); /* every connection closed */
    attnd_otlp_free(s->otlp);  /* after the last request's spans: sends what is queued */
    attnd_sched_free(s->sched);
    attnd_sessions_free(s->sessions); /* after the HTTP side: no request holds a step */
    for (int i = 0; i < s->n_models; i++)
        attn_model_free(&s->models[i]);
    free(s->models);
    free(s->info);
    free(s->fingerprints);
    attnd_meta_free(&s->meta);
    free(s);
}
