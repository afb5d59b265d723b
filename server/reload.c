/* reload.c - SIGHUP's config reading and the models it applies (reload.h). */
#include "reload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/log.h"

/* Copies n entries into a fresh array (NULL and 0 for none). */
static int copy_models(attnd_applied *a, const attnd_model_config *models, int n) {
    a->models = calloc((size_t)(n ? n : 1), sizeof *a->models);
    a->n = 0;
    if (!a->models) return -1;
    for (; a->n < n; a->n++)
        if (attnd_model_config_copy(&a->models[a->n], &models[a->n]) < 0) return -1;
    return 0;
}

int attnd_applied_init(attnd_applied *a, const attnd_config *c) {
    return copy_models(a, c->models, c->n_models);
}

void attnd_applied_free(attnd_applied *a) {
    for (int i = 0; i < a->n; i++)
        attnd_model_config_free(&a->models[i]);
    free(a->models);
    a->models = NULL;
    a->n = 0;
}

static void needs_restart(const char *section, const char *key, void *arg) {
    (void)arg;
    attnd_log(LOG_WARN,
              "SIGHUP: %s.%s changed in the config file; it needs a restart and is left "
              "as it was",
              section, key);
}

/* What one reload did, for its summary line. */
typedef struct {
    int loaded, unloaded, kept, failed;
} tally;

/* One entry of the file: loaded when new, when its entry changed or its
 * weights file was rewritten (LOAD_IF_CHANGED: no new version when the
 * weights are the same); else kept. */
static void apply_entry(attnd_models *ms, const attnd_model_config *mc, tally *t) {
    attnd_error e = {AOK, ""};
    attnd_version *v = attnd_models_get(ms, mc->name, &e);
    int same_entry = v && attnd_model_config_equal(&v->mc, mc);
    attnd_file_id now;
    attnd_file_identify(mc->weights, &now);
    int same_file = same_entry && attnd_file_same(&now, &v->file);
    int before = v ? v->info.version : 0, version = 0;
    attnd_version_unref(v);
    if (same_file) {
        t->kept++;
        return;
    }
    if (attnd_models_load_wait(ms, mc, same_entry ? LOAD_IF_CHANGED : 0, &version, &e) < 0)
        t->failed++; /* logged, counted and its reason set by the table */
    else if (version == before)
        t->kept++;
    else
        t->loaded++;
}

/* 1 when the file's models hold one called name. */
static int has(const attnd_config *c, const char *name) {
    for (int i = 0; i < c->n_models; i++)
        if (strcmp(c->models[i].name, name) == 0) return 1;
    return 0;
}

void attnd_reload(const attnd_config *running, attnd_models *ms, attnd_applied *applied) {
    attnd_config fresh;
    char err[1024];
    memset(&fresh, 0, sizeof fresh);
    if (attnd_config_reread(running, &fresh, err, sizeof err) < 0) {
        char reason[1024];
        attnd_log(LOG_ERROR, "SIGHUP: config not applied, every model keeps its version: %s", err);
        snprintf(reason, sizeof reason, ATTND_REASON_RELOAD_FAILED "%.900s", err);
        attnd_models_reason_serving(ms, reason);
        attnd_models_count_reload(ms, 0);
        return;
    }
    attnd_models_count_reload(ms, 1);
    attnd_models_reason_serving(ms, "");
    attnd_config_changed_keys(running, &fresh, needs_restart, NULL);
    tally t = {0, 0, 0, 0};
    for (int i = 0; i < fresh.n_models; i++)
        apply_entry(ms, &fresh.models[i], &t);
    for (int i = 0; i < applied->n; i++)
        if (!has(&fresh, applied->models[i].name)) {
            attnd_error e;
            if (attnd_models_unload(ms, applied->models[i].name, &e) == 0) t.unloaded++;
        }
    attnd_applied_free(applied);
    if (copy_models(applied, fresh.models, fresh.n_models) < 0)
        attnd_log(LOG_ERROR, "SIGHUP: out of memory keeping the config's models");
    attnd_config_free(&fresh);
    attnd_log(t.failed ? LOG_WARN : LOG_INFO,
              "SIGHUP: config applied: %d model%s loaded, %d unloaded, %d unchanged, %d failed",
              t.loaded, t.loaded == 1 ? "" : "s", t.unloaded, t.kept, t.failed);
}
