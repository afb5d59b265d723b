/* read.c - the config file: reading it (at most 16 MiB), parsing its JSON
 * and walking the document, section by section and model by model, each
 * value handed to its row of the key table (keys.c). Also where a model's
 * weights path is resolved against the config's folder, and checked to open,
 * and where one entry given on its own (a repository load's
 * parameters.config) is read by the same code, its weights path confined to
 * the model folder (confine.c).
 * It knows no key by itself (the table does) and never looks at the
 * environment or the flags (env.c does, after it).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "decoder.h"
#include "enums.h"
#include "keys.h"
#include "read.h"
#include "refuse.h"

/* A config file larger than this is refused before parsing, bytes. */
#define CONFIG_MAX_BYTES (16u << 20)
/* "models" holds at most this many entries. */
#define MODELS_MAX 256

/* The top-level keys: the sections of the server table, and "models". */
static const char *const sections[] = {"server",  "batching", "workers", "limits",
                                       "tracing", "sessions", "models"};
#define N_SECTIONS (int)countof(sections)

/* The message for an unknown key of a section (section NULL: of a model):
 * the nearest key of the same table, or the section a known key belongs in. */
static int no_such_key(const char *section, const char *name, const char *src, const char *key,
                       char *err, size_t errlen) {
    cfg_nearest n = {.name = name};
    char hint[160];
    if (section) {
        for (int i = 0; i < cfg_n_config_keys; i++) {
            if (strcmp(cfg_config_keys[i].key, name) == 0)
                return cfg_fail(err, errlen, "%s: %s: unknown key; \"%s\" belongs in \"%s\".", src,
                                key, name, cfg_config_keys[i].section);
            if (strcmp(cfg_config_keys[i].section, section) == 0)
                cfg_nearest_try(&n, cfg_config_keys[i].key);
        }
    } else {
        for (int i = 0; i < cfg_n_model_keys; i++)
            cfg_nearest_try(&n, cfg_model_keys[i].key);
    }
    return cfg_fail(err, errlen, "%s: %s: unknown key%s.", src, key,
                    cfg_nearest_hint(&n, "", hint, sizeof hint));
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number with a fraction";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static const char *type_wanted(key_type t) {
    switch (t) {
    case K_STR:
    case K_NAME:
        return "a string";
    case K_INT:
    case K_LL:
        return "an integer";
    case K_BOOL:
        return "true or false";
    case K_NUM:
        return "a number";
    case K_STRLIST:
        return "an array of strings";
    default:
        return "an object of strings";
    }
}

static int store_rolemap(attnd_model_config *mc, json_t *v, const char *src, const char *key,
                         char *err, size_t errlen) {
    if (!json_is_object(v))
        return cfg_fail(err, errlen, "%s: %s: must be an object of strings, not %s.", src, key,
                        json_type_name(v));
    const char *role;
    json_t *name;
    json_object_foreach(v, role, name) {
        int r;
        if (attnd_enum_value(&attnd_roles, role, &r) < 0) {
            cfg_nearest n = {.name = role};
            char hint[160], roles[200];
            for (int i = 0; i < attnd_roles.n; i++)
                cfg_nearest_try(&n, attnd_roles.rows[i].name);
            return cfg_fail(err, errlen, "%s: %s.%s: unknown role%s (roles: %s).", src, key, role,
                            cfg_nearest_hint(&n, "", hint, sizeof hint),
                            attnd_enum_words(&attnd_roles, ", ", roles, sizeof roles));
        }
        if (!json_is_string(name))
            return cfg_fail(err, errlen, "%s: %s.%s: must be a string, not %s.", src, key, role,
                            json_type_name(name));
        size_t len = json_string_length(name);
        if (len < 1 || len > 1024 || memchr(json_string_value(name), '\0', len))
            return cfg_fail(err, errlen, "%s: %s.%s: must be a tensor name of 1 to 1024 bytes.",
                            src, key, role);
        if (cfg_set_str(&mc->tensors[r], json_string_value(name)) != 0)
            return cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
    }
    return 0;
}

/* Stores a JSON array of strings (v is an array). */
static int store_json_strlist(void *base, const cfg_key *k, json_t *v, const char *src,
                              const char *key, char *err, size_t errlen) {
    if ((long long)json_array_size(v) > k->max)
        return cfg_fail(err, errlen, "%s: %s: %zu entries, at most %lld allowed.", src, key,
                        json_array_size(v), k->max);
    int n = (int)json_array_size(v), rc = -1;
    const char **items = calloc(n ? (size_t)n : 1, sizeof *items);
    size_t *lens = calloc(n ? (size_t)n : 1, sizeof *lens);
    if (!items || !lens) {
        cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
        goto cleanup;
    }
    for (int i = 0; i < n; i++) {
        json_t *s = json_array_get(v, (size_t)i);
        if (!json_is_string(s)) {
            cfg_fail(err, errlen, "%s: %s[%d]: must be a string, not %s.", src, key, i,
                     json_type_name(s));
            goto cleanup;
        }
        items[i] = json_string_value(s);
        lens[i] = json_string_length(s);
    }
    rc = cfg_store_strlist(base, k, items, lens, n, src, key, err, errlen);
cleanup:
    free(items);
    free(lens);
    return rc;
}

/* Type-checks one JSON value against its row and stores it. */
static int store_json(void *base, const cfg_key *k, json_t *v, const char *src, const char *key,
                      char *err, size_t errlen) {
    switch (k->type) {
    case K_STR:
    case K_NAME:
        if (!json_is_string(v)) break;
        return cfg_store_string(base, k, json_string_value(v), json_string_length(v), src, key, err,
                                errlen);
    case K_INT:
    case K_LL:
        if (json_is_real(v) && cfg_whole(json_real_value(v))) /* 16.0, 1e+06 */
            return cfg_store_number(base, k, (long long)json_real_value(v), src, key, err, errlen);
        if (!json_is_integer(v)) break;
        return cfg_store_number(base, k, (long long)json_integer_value(v), src, key, err, errlen);
    case K_BOOL:
        if (!json_is_boolean(v)) break;
        *FIELD(int, base, k->off) = json_is_true(v);
        return 0;
    case K_STRLIST:
        if (!json_is_array(v)) break;
        return store_json_strlist(base, k, v, src, key, err, errlen);
    case K_NUM:
        if (!json_is_number(v)) break;
        return cfg_store_real(base, k, json_number_value(v), src, key, err, errlen);
    case K_ROLEMAP:
        return store_rolemap((attnd_model_config *)base, v, src, key, err, errlen);
    case K_ROPE:
        return attnd_rope_parse((attnd_model_config *)base, v, src, key, err, errlen);
    }
    return cfg_fail(err, errlen, "%s: %s: must be %s, not %s.", src, key, type_wanted(k->type),
                    json_type_name(v));
}

char *cfg_folder_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return strndup(path, slash ? (size_t)(slash - path + 1) : 0);
}

/* Checks that mc's weights file can be opened and is a regular file. */
static int weights_readable(const attnd_model_config *mc, const char *src, const char *key,
                            char *err, size_t errlen) {
    /* O_NONBLOCK: a FIFO named as weights is refused below, not waited on */
    int fd = open(mc->weights, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return cfg_fail(err, errlen, "%s: %s: cannot open weights file \"%s\": %s.", src, key,
                        mc->weights, strerror(errno));
    struct stat st;
    int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
    if (!regular)
        return cfg_fail(err, errlen, "%s: %s: weights \"%s\" is not a regular file.", src, key,
                        mc->weights);
    return 0;
}

/* A relative path in *slot taken from dir (the config file's folder, with
 * its '/'; "" leaves it as it is). Returns 0, or -1 when out of memory. */
static int from_folder(char **slot, const char *dir) {
    if ((*slot)[0] == '/' || !dir[0]) return 0;
    size_t n = strlen(dir) + strlen(*slot) + 1;
    char *full = malloc(n);
    if (!full) return -1;
    snprintf(full, n, "%s%s", dir, *slot);
    free(*slot);
    *slot = full;
    return 0;
}

/* Resolves mc->weights against dir and, with check_files, checks that it
 * can be read. */
static int resolve_weights(attnd_model_config *mc, const char *dir, int check_files,
                           const char *src, const char *key, char *err, size_t errlen) {
    if (from_folder(&mc->weights, dir) != 0)
        return cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
    return check_files ? weights_readable(mc, src, key, err, errlen) : 0;
}

/* A refusal of one of a model's keys names the model too, when its entry
 * has a name: err's sentence ends " (model \"name\")." Returns -1. */
static int in_model(const json_t *obj, char *err, size_t errlen) {
    const char *name = json_string_value(json_object_get(obj, "name"));
    size_t n = err ? strlen(err) : 0;
    if (name && n > 0 && err[n - 1] == '.')
        snprintf(err + n - 1, errlen - (n - 1), " (model \"%.64s\").", name);
    return -1;
}

/* Reads one model entry, the object obj, into mc (zeroed by the caller).
 * at is what its keys are named under: "models[3]." in the file, "" for
 * an entry on its own (a repository load). */
static int parse_model(attnd_model_config *mc, json_t *obj, const char *at, const char *dir,
                       int check_files, const char *src, char *err, size_t errlen) {
    char key[160];
    int given[CFG_MODEL_KEYS_MAX] = {0};
    for (int i = 0; i < cfg_n_model_keys; i++)
        if (cfg_set_default(mc, &cfg_model_keys[i]) != 0)
            return cfg_fail(err, errlen, "%s: out of memory.", src);
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        int i = 0;
        while (i < cfg_n_model_keys && strcmp(cfg_model_keys[i].key, name) != 0)
            i++;
        snprintf(key, sizeof key, "%s%.100s", at, name);
        if (i == cfg_n_model_keys) return no_such_key(NULL, name, src, key, err, errlen);
        if (json_is_null(v)) { /* the key left out, as a dict saved with None holds it */
            given[i] = -1;
            continue;
        }
        if (store_json(mc, &cfg_model_keys[i], v, src, key, err, errlen) != 0)
            return in_model(obj, err, errlen);
        given[i] = 1;
    }
    for (int i = 0; i < cfg_n_model_keys; i++)
        if (cfg_model_keys[i].required && given[i] != 1)
            return cfg_fail(err, errlen, "%s: %s%s: %s; every model needs it.", src, at,
                            cfg_model_keys[i].key, given[i] ? "null" : "missing");
    if (attnd_model_check(mc, at, src, err, errlen) != 0) return -1;
    snprintf(key, sizeof key, "%sweights", at);
    return resolve_weights(mc, dir, check_files, src, key, err, errlen);
}

static int parse_models(attnd_config *c, json_t *arr, const char *dir, int check_files,
                        const char *src, char *err, size_t errlen) {
    attnd_model_config *models = NULL;
    int n = 0, rc = -1;
    if (!json_is_array(arr)) {
        cfg_fail(err, errlen, "%s: models: must be an array, not %s.", src, json_type_name(arr));
        goto cleanup;
    }
    if (json_array_size(arr) > MODELS_MAX) {
        cfg_fail(err, errlen, "%s: models: %zu models, at most %d allowed.", src,
                 json_array_size(arr), MODELS_MAX);
        goto cleanup;
    }
    size_t want = json_array_size(arr);
    models = calloc(want ? want : 1, sizeof *models);
    if (!models) {
        cfg_fail(err, errlen, "%s: models: out of memory.", src);
        goto cleanup;
    }
    for (; n < (int)want; n++) {
        attnd_model_config *mc = &models[n];
        json_t *obj = json_array_get(arr, (size_t)n);
        char at[32];
        snprintf(at, sizeof at, "models[%d].", n);
        if (!json_is_object(obj)) {
            cfg_fail(err, errlen, "%s: models[%d]: must be an object, not %s.", src, n,
                     json_type_name(obj));
            goto cleanup;
        }
        if (parse_model(mc, obj, at, dir, check_files, src, err, errlen) != 0) {
            n++; /* free the partly filled one too */
            goto cleanup;
        }
        for (int j = 0; j < n; j++) {
            if (strcmp(models[j].name, mc->name) == 0) {
                cfg_fail(err, errlen,
                         "%s: models[%d].name: \"%s\" is already the name of models[%d].", src, n,
                         mc->name, j);
                n++;
                goto cleanup;
            }
        }
    }
    cfg_models_free(c->models, c->n_models);
    c->models = models;
    c->n_models = n;
    models = NULL;
    n = 0;
    rc = 0;
cleanup:
    cfg_models_free(models, n);
    return rc;
}

/* v, or, for a path key (file_relative) holding a relative path, that path
 * taken from dir, the file's folder: a new reference either way (NULL when
 * out of memory). */
static json_t *in_file_folder(const cfg_key *k, json_t *v, const char *dir) {
    const char *s = json_string_value(v);
    if (!k->file_relative || !s || !s[0]) return json_incref(v);
    char *path = strdup(s);
    json_t *j = NULL;
    if (path && from_folder(&path, dir) == 0) j = json_stringn_nocheck(path, strlen(path));
    free(path);
    return j;
}

static int parse_section(attnd_config *c, const char *section, json_t *obj, const char *dir,
                         const char *src, char *err, size_t errlen) {
    if (!json_is_object(obj))
        return cfg_fail(err, errlen, "%s: %s: must be an object, not %s.", src, section,
                        json_type_name(obj));
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        char key[160];
        snprintf(key, sizeof key, "%s.%.100s", section, name);
        const cfg_key *k = NULL;
        for (int i = 0; i < cfg_n_config_keys && !k; i++)
            if (strcmp(cfg_config_keys[i].section, section) == 0 &&
                strcmp(cfg_config_keys[i].key, name) == 0)
                k = &cfg_config_keys[i];
        if (!k) return no_such_key(section, name, src, key, err, errlen);
        if (json_is_null(v)) continue; /* the key left out: its default */
        json_t *value = in_file_folder(k, v, dir);
        if (!value) return cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
        int bad = store_json(c, k, value, src, key, err, errlen);
        json_decref(value);
        if (bad) return -1;
    }
    return 0;
}

int attnd_config_load_mem(attnd_config *c, const char *text, size_t len, const char *file,
                          int check_files, char *err, size_t errlen) {
    json_error_t jerr;
    json_t *root = NULL;
    char *dir = NULL;
    int rc = -1;
    /* a UTF-8 byte order mark, which Windows editors write: RFC 8259 lets
     * a parser ignore it */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3, len -= 3;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        cfg_fail(err, errlen, "%s: not valid JSON (line %d, column %d): %s.", file, jerr.line,
                 jerr.column, jerr.text);
        goto cleanup;
    }
    if (!json_is_object(root)) {
        cfg_fail(err, errlen, "%s: the top level must be an object, not %s.", file,
                 json_type_name(root));
        goto cleanup;
    }
    dir = cfg_folder_of(file);
    if (!dir || cfg_set_str(&c->config_path, file) != 0) {
        cfg_fail(err, errlen, "%s: out of memory.", file);
        goto cleanup;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (cfg_name_index(name, sections, N_SECTIONS) < 0) {
            char hint[160];
            cfg_fail(err, errlen,
                     "%s: %.100s: unknown key%s (known: server, batching, workers, limits, "
                     "tracing, sessions, models).",
                     file, name, cfg_did_you_mean(name, sections, N_SECTIONS, hint, sizeof hint));
            goto cleanup;
        }
        int bad = strcmp(name, "models") == 0
                      ? parse_models(c, v, dir, check_files, file, err, errlen)
                      : parse_section(c, name, v, dir, file, err, errlen);
        if (bad) goto cleanup;
    }
    rc = 0;
cleanup:
    free(dir);
    json_decref(root);
    return rc;
}

int cfg_load_file(attnd_config *c, const char *path, int check_files, char *err, size_t errlen) {
    FILE *f = NULL;
    char *text = NULL;
    int rc = -1;
    f = fopen(path, "rb");
    if (!f) {
        cfg_fail(err, errlen, "%s: cannot open config file: %s.", path, strerror(errno));
        goto cleanup;
    }
    text = malloc(CONFIG_MAX_BYTES + 1);
    if (!text) {
        cfg_fail(err, errlen, "%s: out of memory.", path);
        goto cleanup;
    }
    size_t n = fread(text, 1, CONFIG_MAX_BYTES + 1, f);
    if (ferror(f)) {
        cfg_fail(err, errlen, "%s: cannot read config file: %s.", path, strerror(errno));
        goto cleanup;
    }
    if (n > CONFIG_MAX_BYTES) {
        cfg_fail(err, errlen, "%s: config file is larger than %u bytes.", path, CONFIG_MAX_BYTES);
        goto cleanup;
    }
    rc = attnd_config_load_mem(c, text, n, path, check_files, err, errlen);
cleanup:
    free(text);
    if (f) fclose(f);
    return rc;
}

int attnd_config_load_file(attnd_config *c, const char *path, char *err, size_t errlen) {
    return cfg_load_file(c, path, 1, err, errlen);
}

/* Checks that every model's weights file can be opened; config_file names
 * where the models came from. */
int cfg_models_readable(const attnd_config *c, const char *config_file, char *err, size_t errlen) {
    char key[160];
    for (int i = 0; i < c->n_models; i++) {
        snprintf(key, sizeof key, "models[%d].weights", i);
        if (c->models[i].weights &&
            weights_readable(&c->models[i], config_file, key, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* The entry's "name": the route's name when left out; refused when it
 * differs from it. */
static int entry_name(json_t *obj, const char *name, const char *src, char *err, size_t errlen) {
    json_t *v = json_object_get(obj, "name");
    if (!v) {
        if (json_object_set_new(obj, "name", json_stringn_nocheck(name, strlen(name))) != 0)
            return cfg_fail(err, errlen, "%s: name: out of memory.", src);
        return 0;
    }
    if (json_is_string(v) && strcmp(json_string_value(v), name) != 0)
        return cfg_fail(err, errlen,
                        "%s: name: '%.64s' does not match the name in the path '%.64s'.", src,
                        json_string_value(v), name);
    return 0; /* not a string: parse_model says so */
}

/* mc->weights confined to model_dir, and readable: 0, -1 (the path leaves
 * the folder), or -2 (it stays inside but its file cannot be read). */
static int confine_weights(attnd_model_config *mc, const char *model_dir, const char *src,
                           char *err, size_t errlen) {
    char why[480];
    char *real = NULL;
    int rc = attnd_path_confine(model_dir, mc->weights, &real, why, sizeof why);
    if (rc != 0) {
        cfg_fail(err, errlen, "%s: weights: %s", src, why);
        return rc;
    }
    free(mc->weights);
    mc->weights = real;
    return weights_readable(mc, src, "weights", err, errlen) != 0 ? -2 : 0;
}

int attnd_model_entry_parse(const char *text, size_t len, const char *name, const char *model_dir,
                            attnd_model_config *mc, char *err, size_t errlen) {
    static const char src[] = "parameters.config";
    json_error_t jerr;
    int rc = -1;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) {
        cfg_fail(err, errlen, "%s: not valid JSON (line %d, column %d): %s.", src, jerr.line,
                 jerr.column, jerr.text);
        goto cleanup;
    }
    if (!json_is_object(root)) {
        cfg_fail(err, errlen, "%s: must be a JSON object (one entry of \"models\"), not %s.", src,
                 json_type_name(root));
        goto cleanup;
    }
    /* the folder is model_dir, by attnd_path_confine, not the config file's */
    if (entry_name(root, name, src, err, errlen) != 0 ||
        parse_model(mc, root, "", "", 0, src, err, errlen) != 0)
        goto cleanup;
    rc = confine_weights(mc, model_dir, src, err, errlen);
cleanup:
    json_decref(root);
    if (rc != 0) attnd_model_config_free(mc);
    return rc;
}
