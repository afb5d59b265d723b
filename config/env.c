/* env.c - the environment and the command line: the ATTND_* variables and
 * the --flags that override the config file, read by the rows of the key
 * table (keys.c), and the start-up road that layers them: defaults < config
 * file (read.c) < variables < flags, then the embedded default model when
 * none is configured, and the settling of what the server reads resolved
 * (server.model_dir's folder, server.model_control); the same road again
 * for a reload (attnd_config_reread). Also --help's text, printed from the
 * same table.
 * It parses no JSON and never exits: main() decides what a refusal means.
 */
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "default_model.h"
#include "enums.h"
#include "keys.h"
#include "read.h"
#include "refuse.h"

/* Parses a decimal integer that fills the whole string. */
static int parse_ll(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

/* Splits a comma-separated list into at most cap items (pointers into s
 * and lengths), dropping the spaces around each; returns how many. A list
 * longer than cap is cut at cap items, so that a cap one past the row's
 * maximum lets cfg_store_strlist refuse it. */
static int split_commas(const char *s, const char **items, size_t *lens, int cap) {
    int n = 0;
    for (const char *p = s; *p && n < cap; n++) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        while (p < end && *p == ' ')
            p++;
        items[n] = p;
        while (end > p && end[-1] == ' ')
            end--;
        lens[n] = (size_t)(end - p);
        if (!comma) return n + 1;
        p = comma + 1;
    }
    return n;
}

/* Stores a value given as text (an env variable or a flag); a list is
 * comma-separated. */
static int store_text(void *base, const cfg_key *k, const char *s, const char *src, const char *key,
                      char *err, size_t errlen) {
    if (k->type == K_INT || k->type == K_LL) {
        long long v;
        if (parse_ll(s, &v) != 0)
            return cfg_fail(err, errlen, "%s: %s: \"%s\" is not an integer.", src, key, s);
        return cfg_store_number(base, k, v, src, key, err, errlen);
    }
    if (k->type == K_BOOL) {
        int v = strcmp(s, "true") == 0 || strcmp(s, "1") == 0;
        if (!v && strcmp(s, "false") != 0 && strcmp(s, "0") != 0)
            return cfg_fail(err, errlen, "%s: %s: \"%s\" is not true, false, 1 or 0.", src, key, s);
        *FIELD(int, base, k->off) = v;
        return 0;
    }
    if (k->type == K_STRLIST) {
        const char *items[CFG_CORS_MAX + 1];
        size_t lens[CFG_CORS_MAX + 1];
        int n = split_commas(s, items, lens, CFG_CORS_MAX + 1);
        return cfg_store_strlist(base, k, items, lens, n, src, key, err, errlen);
    }
    return cfg_store_string(base, k, s, strlen(s), src, key, err, errlen);
}

static void key_path(char *out, size_t n, const cfg_key *k) {
    snprintf(out, n, "%s.%s", k->section, k->key);
}

/* Adds the embedded default model (weights == NULL). */
static int add_default_model(attnd_config *c, char *err, size_t errlen) {
    attnd_model_config *mc = calloc(1, sizeof *mc);
    if (!mc) return cfg_fail(err, errlen, "out of memory.");
    snprintf(mc->name, sizeof mc->name, "default");
    attnd_default_hparams(&mc->hp);
    if (cfg_set_str(&mc->prefix, "") != 0 || cfg_set_str(&mc->layout, "torch") != 0) {
        cfg_models_free(mc, 1);
        return cfg_fail(err, errlen, "out of memory.");
    }
    cfg_models_free(c->models, c->n_models);
    c->models = mc;
    c->n_models = 1;
    return 0;
}

static const cfg_key *find_flag(const char *flag, size_t len) {
    for (int i = 0; i < cfg_n_config_keys; i++)
        if (cfg_config_keys[i].flag && strlen(cfg_config_keys[i].flag) == len &&
            strncmp(cfg_config_keys[i].flag, flag, len) == 0)
            return &cfg_config_keys[i];
    return NULL;
}

/* Splits argv[*i] into a flag and its value ("--x=v" or "--x v").
 * Returns 0, or -1 with err set when the value is missing. */
static int flag_value(int argc, char **argv, int *i, size_t *flen, const char **val, char *err,
                      size_t errlen) {
    const char *a = argv[*i];
    const char *eq = strchr(a, '=');
    if (eq) {
        *flen = (size_t)(eq - a);
        *val = eq + 1;
        return 0;
    }
    *flen = strlen(a);
    if (*i + 1 >= argc) return cfg_fail(err, errlen, "flag %s: needs a value.", a);
    *val = argv[++*i];
    return 0;
}

/* The value of a string server key from its flag (the last given) or, with
 * no flag, its variable; NULL when neither gives one the key allows. */
static const char *early_value(const char *name, int argc, char **argv) {
    const cfg_key *k = NULL;
    for (int i = 0; i < cfg_n_config_keys && !k; i++)
        if (strcmp(cfg_config_keys[i].key, name) == 0 && cfg_config_keys[i].section)
            k = &cfg_config_keys[i];
    const char *val = k && k->env ? getenv(k->env) : NULL;
    size_t flen = k && k->flag ? strlen(k->flag) : 0;
    for (int i = 1; flen && i < argc; i++) {
        if (strncmp(argv[i], k->flag, flen) != 0) continue;
        if (argv[i][flen] == '=')
            val = argv[i] + flen + 1;
        else if (argv[i][flen] == '\0' && i + 1 < argc)
            val = argv[++i];
    }
    char rule[200];
    return val && *val && !cfg_rule_broken(k, val, rule, sizeof rule) ? val : NULL;
}

void attnd_config_log_early(int argc, char **argv, const char **format, const char **level) {
    const char *f = early_value("log_format", argc, argv);
    const char *l = early_value("log_level", argc, argv);
    *format = f ? f : "text";
    *level = l ? l : "info";
}

/* The message for a flag no row has, with the nearest one that exists. */
static int unknown_flag(const char *a, size_t flen, char *err, size_t errlen) {
    char name[80], hint[160];
    snprintf(name, sizeof name, "%.*s", (int)(flen < 79 ? flen : 79), a);
    cfg_nearest n = {.name = name + 2};
    cfg_nearest_try(&n, "config");
    cfg_nearest_try(&n, "help");
    cfg_nearest_try(&n, "version");
    for (int k = 0; k < cfg_n_config_keys; k++)
        if (cfg_config_keys[k].flag) cfg_nearest_try(&n, cfg_config_keys[k].flag + 2);
    return cfg_fail(err, errlen, "unknown flag \"%.*s\"%s (see --help).", (int)flen, a,
                    cfg_nearest_hint(&n, "--", hint, sizeof hint));
}

/* The first pass over argv: stops at --help or --version (*want says
 * which); else checks that every argument is a known flag with a value, and
 * sets *config_file to --config's (the last given; untouched when none). */
static int scan_args(int argc, char **argv, int *want, const char **config_file, char *err,
                     size_t errlen) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *want = ATTND_WANT_HELP;
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            *want = ATTND_WANT_VERSION;
            return 0;
        }
        if (strncmp(a, "--", 2) != 0)
            return cfg_fail(err, errlen, "unexpected argument \"%s\" (see --help).", a);
        const char *eq = strchr(a, '=');
        size_t flen = eq ? (size_t)(eq - a) : strlen(a);
        int is_config = flen == 8 && strncmp(a, "--config", 8) == 0;
        if (!is_config && !find_flag(a, flen)) return unknown_flag(a, flen, err, errlen);
        if (flag_value(argc, argv, &i, &flen, &val, err, errlen) != 0) return -1;
        if (is_config) *config_file = val;
    }
    return 0;
}

/* ---- service links ---- */

/* 1 when name=value is a service link's address: Kubernetes gives every
 * pod {SVC}_PORT=tcp://ADDR:PORT for each Service of its namespace (SVC its
 * name in capitals, '-' made '_'), and Docker's legacy links do the same.
 * A Service named "attnd" or "attnd-grpc" so sets ATTND_PORT or
 * ATTND_GRPC_PORT: an address of another's, never a port for attnd. */
static int service_link(const char *name, const char *value) {
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 5, "_PORT") != 0) return 0;
    return strncmp(value, "tcp://", 6) == 0 || strncmp(value, "udp://", 6) == 0 ||
           strncmp(value, "sctp://", 7) == 0;
}

/* 1 for a service link's other variables: {SVC}_SERVICE_HOST,
 * {SVC}_SERVICE_PORT[_{PORT NAME}] and {SVC}_PORT_{N}_{TCP|UDP|SCTP}[_...]. */
static int service_link_part(const char *name) {
    if (strstr(name, "_SERVICE_HOST") || strstr(name, "_SERVICE_PORT")) return 1;
    for (const char *p = strstr(name, "_PORT_"); p; p = strstr(p + 1, "_PORT_")) {
        const char *d = p + 6;
        if (!isdigit((unsigned char)*d)) continue;
        while (isdigit((unsigned char)*d))
            d++;
        if (!strncmp(d, "_TCP", 4) || !strncmp(d, "_UDP", 4) || !strncmp(d, "_SCTP", 5)) return 1;
    }
    return 0;
}

static const cfg_key *find_env(const char *name) {
    for (int i = 0; i < cfg_n_config_keys; i++)
        if (cfg_config_keys[i].env && strcmp(cfg_config_keys[i].env, name) == 0)
            return &cfg_config_keys[i];
    return NULL;
}

/* What to say of the variable name=value, or NULL: a service link over one
 * of attnd's (ignored), or a name attnd does not read. */
static const char *env_note(const attnd_config *c, const char *name, const char *value, char *out,
                            size_t cap) {
    const cfg_key *k = find_env(name);
    if (k && service_link(name, value)) {
        char key[160];
        key_path(key, sizeof key, k);
        snprintf(out, cap,
                 "environment variable %s: \"%.80s\" is a service link (Kubernetes sets "
                 "{SERVICE}_PORT to a Service's address in every pod of its namespace), not a "
                 "value for %s; ignored. Give %s in the container's env, or set "
                 "enableServiceLinks: false in the pod spec",
                 name, value, key, name);
        return out;
    }
    if (k || strcmp(name, "ATTND_CONFIG") == 0 ||
        (c->api_key_env && strcmp(name, c->api_key_env) == 0) || service_link(name, value) ||
        service_link_part(name))
        return NULL;
    char hint[160];
    cfg_nearest n = {.name = name};
    cfg_nearest_try(&n, "ATTND_CONFIG");
    for (int i = 0; i < cfg_n_config_keys; i++)
        if (cfg_config_keys[i].env) cfg_nearest_try(&n, cfg_config_keys[i].env);
    if (c->api_key_env) cfg_nearest_try(&n, c->api_key_env);
    snprintf(out, cap,
             "environment variable %s is not one attnd reads%s; ignored (attnd --help lists "
             "them)",
             name, cfg_nearest_hint(&n, "", hint, sizeof hint));
    return out;
}

void attnd_config_env_notes(const attnd_config *c, void (*note)(void *arg, const char *sentence),
                            void *arg) {
    extern char **environ;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "ATTND_", 6) != 0 || !eq || !eq[1]) continue;
        char name[128], text[1024];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e < 127 ? eq - *e : 127), *e);
        if (env_note(c, name, eq + 1, text, sizeof text)) note(arg, text);
    }
}

/* Stores every ATTND_* variable that is set and not empty, but a service
 * link's address (attnd_config_env_notes says so). */
static int apply_env(attnd_config *c, char *err, size_t errlen) {
    char src[200], key[160];
    for (int i = 0; i < cfg_n_config_keys; i++) {
        const cfg_key *k = &cfg_config_keys[i];
        const char *env = k->env ? getenv(k->env) : NULL;
        if (!env || !*env) continue; /* empty = unset, as Docker's "VAR=" means */
        if (service_link(k->env, env)) continue;
        snprintf(src, sizeof src, "environment variable %s", k->env);
        key_path(key, sizeof key, k);
        if (store_text(c, k, env, src, key, err, errlen) != 0) return -1;
    }
    return 0;
}

/* Stores every flag but --config, in the order given (scan_args has
 * checked them). */
static int apply_flags(attnd_config *c, int argc, char **argv, char *err, size_t errlen) {
    char src[200], key[160];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        size_t flen;
        if (flag_value(argc, argv, &i, &flen, &val, err, errlen) != 0) return -1;
        const cfg_key *k = find_flag(a, flen);
        if (!k) continue; /* --config */
        snprintf(src, sizeof src, "flag %s", k->flag);
        key_path(key, sizeof key, k);
        if (store_text(c, k, val, src, key, err, errlen) != 0) return -1;
    }
    return 0;
}

/* server.model_dir made absolute, symbolic links resolved, so that
 * attnd_path_confine compares resolved paths; when not given, the config
 * file's folder (the working directory without a file). */
static int settle_model_dir(attnd_config *c, const char *config_file, char *err, size_t errlen) {
    char *folder = NULL;
    if (!c->model_dir) {
        folder = config_file ? cfg_folder_of(config_file) : strdup(".");
        if (!folder) return cfg_fail(err, errlen, "server.model_dir: out of memory.");
    }
    const char *want = c->model_dir ? c->model_dir : folder[0] ? folder : ".";
    char *real = realpath(want, NULL);
    if (!real) {
        int rc = cfg_fail(err, errlen,
                          "server.model_dir: the model folder \"%s\"%s cannot be "
                          "opened: %s.",
                          want, c->model_dir ? "" : " (the config file's folder)", strerror(errno));
        free(folder);
        return rc;
    }
    free(folder);
    free(c->model_dir);
    c->model_dir = real;
    return 0;
}

/* The road after the defaults: defaults < config file < ATTND_* variables
 * < flags, then the embedded default model when none is configured, and
 * what the server reads resolved from the keys. No weights file is opened. */
static int layer(attnd_config *c, const char *config_file, int argc, char **argv, char *err,
                 size_t errlen) {
    if (config_file && cfg_load_file(c, config_file, 0, err, errlen) != 0) return -1;
    if (apply_env(c, err, errlen) != 0 || apply_flags(c, argc, argv, err, errlen) != 0) return -1;
    if (c->n_models == 0 && add_default_model(c, err, errlen) != 0) return -1;
    if (settle_model_dir(c, config_file, err, errlen) != 0) return -1;
    int control = ATTND_CONTROL_NONE;
    attnd_enum_value(&attnd_model_controls, c->model_control, &control); /* checked when stored */
    c->explicit_control = control == ATTND_CONTROL_EXPLICIT;
    c->argc = argc;
    c->argv = argv;
    return 0;
}

int attnd_config_from_args(attnd_config *c, int argc, char **argv, int *want_help, char *err,
                           size_t errlen) {
    const char *config_file = NULL;
    *want_help = 0;
    if (attnd_config_defaults(c) != 0) return cfg_fail(err, errlen, "out of memory.");
    if (scan_args(argc, argv, want_help, &config_file, err, errlen) != 0) goto fail;
    if (*want_help) return 0;
    if (!config_file) {
        const char *env = getenv("ATTND_CONFIG");
        if (env && *env) config_file = env;
    }
    if (layer(c, config_file, argc, argv, err, errlen) != 0) goto fail;
    /* the config is sound; what is left is the weights files' business */
    if (cfg_models_readable(c, config_file, err, errlen) != 0) {
        attnd_config_free(c);
        return -2;
    }
    return 0;
fail:
    attnd_config_free(c);
    return -1;
}

int attnd_config_reread(const attnd_config *running, attnd_config *fresh, char *err,
                        size_t errlen) {
    if (attnd_config_defaults(fresh) != 0) return cfg_fail(err, errlen, "out of memory.");
    /* the file read at start, by the name it was read under: --config or
     * ATTND_CONFIG as they were then (scan_args checked running's flags) */
    if (layer(fresh, running->config_path, running->argc, running->argv, err, errlen) != 0) {
        attnd_config_free(fresh);
        return -1;
    }
    return 0;
}

void attnd_config_usage(FILE *f, const char *argv0) {
    fprintf(f,
            "Usage: %s [--config FILE] [flags]\n"
            "Serves attention layers over HTTP: torch.nn.MultiheadAttention layers, and\n"
            "decoder attention (grouped key/value heads, head_dim, scale, rotary positions;\n"
            "Llama-layout checkpoints) with KV-cache sessions that decode step by step\n"
            "(POST /v1/sessions; limits.max_sessions and the limits.max_session_bytes*\n"
            "budgets; sessions.save_dir keeps them across a restart). Native and KServe v2\n"
            "APIs (docs/api.md); every config key, with its range and default, in\n"
            "docs/config.md.\n"
            "Precedence: defaults < config file < ATTND_* variables < flags.\n\n"
            "Flags:\n"
            "  --config FILE                JSON config file (env ATTND_CONFIG)\n",
            argv0 ? argv0 : "attnd");
    for (int i = 0; i < cfg_n_config_keys; i++) {
        const cfg_key *k = &cfg_config_keys[i];
        if (!k->flag) continue;
        char left[64];
        snprintf(left, sizeof left, "%s %s", k->flag, k->type == K_STR ? "STR" : "N");
        char words[160] = "";
        if (k->choices) attnd_enum_words(k->choices, " | ", words, sizeof words);
        fprintf(f, "  %-28s %s.%s: %s%s%s\n", left, k->section, k->key, k->help,
                words[0] ? ": " : "", words);
    }
    fprintf(f, "  %-28s print the version and exit\n", "--version");
    fprintf(f, "  %-28s print this and exit\n\nEnvironment:\n", "-h, --help");
    fprintf(f, "  %-28s config file, when --config is not given\n", "ATTND_CONFIG");
    for (int i = 0; i < cfg_n_config_keys; i++) {
        const cfg_key *k = &cfg_config_keys[i];
        if (!k->env) continue;
        char def[64];
        if (k->def_words)
            snprintf(def, sizeof def, "%s", k->def_words);
        else if (k->type == K_STR && !k->def_str)
            snprintf(def, sizeof def, "none");
        else if (k->type == K_STR)
            snprintf(def, sizeof def, "\"%s\"", k->def_str);
        else if (k->type == K_STRLIST)
            snprintf(def, sizeof def, "none");
        else if (k->type == K_BOOL)
            snprintf(def, sizeof def, "%s", k->def ? "true" : "false");
        else
            snprintf(def, sizeof def, "%lld", k->def);
        fprintf(f, "  %-28s %s.%s (default %s)\n", k->env, k->section, k->key, def);
    }
    fprintf(f,
            "  %-28s the API key clients must send as \"Authorization: Bearer KEY\";\n"
            "  %-28s read from the variable named by server.api_key_env\n\n"
            "With no model configured, the embedded model \"default\" (E=%d, H=%d, seeded\n"
            "weights) is served.\n",
            "ATTND_API_KEY", "", ATTND_DEFAULT_E, ATTND_DEFAULT_H);
}
