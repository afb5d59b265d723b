/* repo.c - the model repository routes' bodies (repo.h): small control
 * messages, parsed whole with Jansson (the tensor readers' streaming is for
 * bodies of megabytes). A body may be empty; when it is not, it is one
 * JSON object whose every key is known, each refusal naming the field and
 * what the route takes. A load's model entry is read by config/'s
 * attnd_model_entry_parse, so it is checked as the config file's are.
 */
#include "repo.h"

#include <jansson.h>
#include <string.h>

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* The body as a JSON object into *root (the caller decrefs it); NULL when
 * the body is empty or only white space. Returns 0, or -1 with the 400. */
static int body_object(const char *body, size_t len, json_t **root, attnd_error *e) {
    *root = NULL;
    size_t i = 0;
    while (i < len && body[i] && strchr(" \t\r\n", body[i]))
        i++;
    if (i == len) return 0;
    json_error_t jerr;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!j)
        return attnd_set_error(e, AERR_BAD_REQUEST, "body: not valid JSON (line %d, column %d): %s",
                               jerr.line, jerr.column, jerr.text);
    if (!json_is_object(j)) {
        attnd_set_error(e, AERR_BAD_REQUEST, "body: expected a JSON object, not %s", json_kind(j));
        json_decref(j);
        return -1;
    }
    *root = j;
    return 0;
}

/* The object at field `where` ("parameters"); -1 with the 400 when v is
 * not one. */
static int want_object(const json_t *v, const char *where, attnd_error *e) {
    if (json_is_object(v)) return 0;
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected a JSON object, not %s", where,
                           json_kind(v));
}

int attnd_repo_parse_index(const char *body, size_t len, int *ready_only, attnd_error *e) {
    json_t *root;
    *ready_only = 0;
    if (body_object(body, len, &root, e) != 0) return -1;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "ready") != 0) {
            rc = attnd_set_error(e, AERR_BAD_REQUEST,
                                 "%.64s: unknown field (the index takes 'ready')", key);
            break;
        }
        if (!json_is_boolean(v)) {
            rc = attnd_set_error(e, AERR_BAD_REQUEST, "ready: expected true or false, not %s",
                                 json_kind(v));
            break;
        }
        *ready_only = json_is_true(v);
    }
    json_decref(root);
    return rc;
}

/* A load's "parameters": *config set to parameters.config (borrowed from
 * params), or NULL when it is not given. */
static int load_parameters(json_t *params, json_t **config, attnd_error *e) {
    *config = NULL;
    if (want_object(params, "parameters", e) != 0) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(params, key, v) {
        if (strcmp(key, "config") != 0)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "parameters.%.64s: unknown parameter (a load takes 'config')",
                                   key);
        if (!json_is_string(v))
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "parameters.config: expected a string holding one model entry "
                                   "as JSON text, not %s",
                                   json_kind(v));
        *config = v;
    }
    return 0;
}

/* The refusal of a model entry: err (a config sentence) as the 400's. */
static int entry_refused(const char *err, attnd_error *e) {
    size_t n = strlen(err);
    if (n > 0 && err[n - 1] == '.') n--; /* the server's sentences end bare */
    return attnd_set_error(e, AERR_BAD_REQUEST, "%.*s", (int)n, err);
}

int attnd_repo_parse_load(const char *body, size_t len, const char *name, const char *model_dir,
                          attnd_model_config *mc, int *given, attnd_error *e) {
    json_t *root, *config = NULL;
    *given = 0;
    if (body_object(body, len, &root, e) != 0) return -1;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "parameters") != 0)
            rc = attnd_set_error(e, AERR_BAD_REQUEST,
                                 "%.64s: unknown field (a load takes 'parameters')", key);
        else
            rc = load_parameters(v, &config, e);
        if (rc != 0) break;
    }
    if (rc == 0 && config) {
        char err[sizeof e->msg];
        int r = attnd_model_entry_parse(json_string_value(config), json_string_length(config), name,
                                        model_dir, mc, err, sizeof err);
        if (r != 0) rc = entry_refused(err, e);
        *given = r == 0 || r == -2; /* -2: its weights file, inside, cannot be read */
    }
    json_decref(root);
    return rc;
}

/* An unload's "parameters": only Triton's unload_dependents, a boolean. */
static int unload_parameters(json_t *params, attnd_error *e) {
    if (want_object(params, "parameters", e) != 0) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(params, key, v) {
        if (strcmp(key, "unload_dependents") != 0)
            return attnd_set_error(
                e, AERR_BAD_REQUEST,
                "parameters.%.64s: unknown parameter (an unload takes 'unload_dependents')", key);
        if (!json_is_boolean(v))
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "parameters.unload_dependents: expected true or false, not %s",
                                   json_kind(v));
    }
    return 0;
}

int attnd_repo_parse_unload(const char *body, size_t len, attnd_error *e) {
    json_t *root;
    if (body_object(body, len, &root, e) != 0) return -1;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "parameters") != 0)
            rc = attnd_set_error(e, AERR_BAD_REQUEST,
                                 "%.64s: unknown field (an unload takes 'parameters')", key);
        else
            rc = unload_parameters(v, e);
        if (rc != 0) break;
    }
    json_decref(root);
    return rc;
}

int attnd_repo_file_entry(const attnd_config *running, const char *name, attnd_model_config *mc,
                          attnd_error *e) {
    attnd_config fresh;
    char err[512];
    memset(&fresh, 0, sizeof fresh);
    if (attnd_config_reread(running, &fresh, err, sizeof err) < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST, "the config file: %s", err);
    int rc = -1;
    e->code = AOK;
    for (int i = 0; i < fresh.n_models && rc < 0; i++)
        if (strcmp(fresh.models[i].name, name) == 0) {
            rc = attnd_model_config_copy(mc, &fresh.models[i]);
            if (rc < 0) attnd_set_error(e, AERR_INTERNAL, "out of memory");
        }
    if (rc < 0 && e->code == AOK)
        attnd_set_error(e, AERR_NOT_FOUND,
                        "no model '%.64s' in the config file %s: give its entry as "
                        "parameters.config, or add it to the file",
                        name, running->config_path ? running->config_path : "(none)");
    attnd_config_free(&fresh);
    return rc;
}
