/* control.c - the model repository's routes (SPEC section 12): the index,
 * a load and an unload, over the model table (server/models/registry.h).
 * A load reads and packs weights, which takes a while for a large layer:
 * its connection is suspended and the table's loader thread answers it,
 * so that the HTTP threads never wait for one. Beside handlers.c, below
 * the table.
 */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../body/repo.h"
#include "handlers.h"
#include "hreq.h"

/* The request body read so far (not NUL-terminated), "" when none. */
static const char *body_of(const hreq *h) {
    return h->in.p ? h->in.p : "";
}

/* 0 when the repository routes may answer: model control on, not draining;
 * else -1 with the 403 or the 503. */
static int allowed(hreq *h) {
    if (!h->srv->cfg->explicit_control)
        return attnd_set_error(&h->err, AERR_FORBIDDEN,
                               "model control is off: set server.model_control to \"explicit\" "
                               "to load and unload models over the API (SIGHUP applies the "
                               "config file's models either way)");
    if (atomic_load(&h->srv->state) != S_READY)
        return attnd_set_error(&h->err, AERR_UNAVAILABLE, "draining");
    return 0;
}

/* A JSON body written here, or the 500 of none. */
static int answer(hreq *h, char *body, size_t len) {
    if (!body) return attnd_set_error(&h->err, AERR_INTERNAL, "out of memory");
    attnd_reply_set(&h->r.reply, AOK, body, len, 0);
    return 0;
}

/* POST /v2/repository/index */
int attnd_handle_repo_index(hreq *h) {
    int ready_only = 0;
    if (allowed(h) < 0 || attnd_repo_parse_index(body_of(h), h->in.len, &ready_only, &h->err) < 0)
        return -1;
    size_t len = 0;
    char *body = attnd_models_index(h->srv->env->models, ready_only, &len);
    return answer(h, body, len);
}

/* The loader thread finished h's load: its answer, then the connection
 * resumes and glue.c, called again, sends it (what attnd_http_answer_ready
 * does for the scheduler: glue.c sits above this file, which must not
 * call up to it). */
static void load_done(void *arg, int rc, int version, const attnd_error *e) {
    hreq *h = arg;
    if (rc < 0) {
        attnd_reply_error(&h->r.reply, e);
    } else {
        char *body = malloc(ATTND_NAME_MAX + 64);
        if (body) {
            int n = snprintf(body, ATTND_NAME_MAX + 64, "{\"name\":\"%.63s\",\"version\":\"%d\"}\n",
                             h->rm.name, version);
            attnd_reply_set(&h->r.reply, AOK, body, (size_t)n, 0);
        } else {
            attnd_error oom;
            attnd_set_error(&oom, AERR_INTERNAL, "out of memory");
            attnd_reply_error(&h->r.reply, &oom);
        }
    }
    MHD_resume_connection(h->conn);
    attnd_req_unref(&h->r);
}

/* POST /v2/repository/models/{name}/load: the entry given as
 * parameters.config (its weights inside server.model_dir), or the config
 * file's; the load queued on the loader thread with the connection
 * suspended. {name} is a model name ([A-Za-z0-9._-]) as the entry's. */
int attnd_handle_repo_load(hreq *h) {
    attnd_http *s = h->srv;
    attnd_model_config mc;
    int given = 0;
    memset(&mc, 0, sizeof mc);
    if (allowed(h) < 0) return -1;
    if (attnd_repo_parse_load(body_of(h), h->in.len, h->rm.name, s->cfg->model_dir, &mc, &given,
                              &h->err) < 0)
        goto refused;
    if (!given && attnd_repo_file_entry(s->cfg, h->rm.name, &mc, &h->err) < 0) {
        given = h->err.code != AERR_NOT_FOUND; /* a config file that fails is a failed load */
        goto refused;
    }
    snprintf(h->model, sizeof h->model, "%s", mc.name);
    attnd_req_ref(&h->r); /* the loader's, let go by load_done */
    h->phase = P_WAIT;    /* suspended first: the load may finish before we return */
    MHD_suspend_connection(h->conn);
    attnd_error e = {AOK, ""};
    if (attnd_models_load_async(s->env->models, &mc, load_done, h, &e) < 0) {
        attnd_reply_error(&h->r.reply, &e);
        MHD_resume_connection(h->conn);
        attnd_req_unref(&h->r);
    }
    attnd_model_config_free(&mc);
    return 0;
refused:
    /* an entry whose weights file cannot be read is a load that failed, as
     * one whose file does not fit, and so is a config file that does not
     * read; a bad body or a path that leaves the model folder asked for
     * nothing that could load */
    if (given) attnd_models_refused(s->env->models, h->rm.name, &h->err);
    return -1;
}

/* POST /v2/repository/models/{name}/unload */
int attnd_handle_repo_unload(hreq *h) {
    if (allowed(h) < 0 || attnd_repo_parse_unload(body_of(h), h->in.len, &h->err) < 0 ||
        attnd_models_unload(h->srv->env->models, h->rm.name, &h->err) < 0)
        return -1;
    snprintf(h->model, sizeof h->model, "%.63s", h->rm.name);
    size_t cap = ATTND_NAME_MAX + 32;
    char *body = malloc(cap);
    int n = body ? snprintf(body, cap, "{\"name\":\"%.63s\"}\n", h->rm.name) : 0;
    return answer(h, body, (size_t)n);
}
