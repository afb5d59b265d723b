/* config.c - the config file, the ATTND_* environment variables and the
 * flags, read into an attnd_config. Every key is one row of a table (name,
 * type, range, default, where it lands, its env variable and flag) and one
 * loop reads them all, so a key is added by adding a row. Models are a
 * second table of the same kind.
 * It opens the weights files only to check that they exist; loading them is
 * weights.c's job. It never listens and never exits.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "decoder.h"
#include "default_model.h"
#include "enums.h"
#include "refuse.h"

/* A config file larger than this is refused before parsing, bytes. */
#define CONFIG_MAX_BYTES (16u << 20)
#define MODELS_MAX 256
#define CORS_MAX 64

typedef enum {
    K_STR,     /* char *, length in [min, max] */
    K_INT,     /* int in [min, max] */
    K_LL,      /* long long in [min, max] */
    K_BOOL,    /* int 0/1 from a JSON boolean */
    K_STRLIST, /* char ** plus an int count at off_n; at most max entries */
    K_NAME,    /* char[ATTND_NAME_MAX] in place */
    K_ROLEMAP, /* the "tensors" object: role -> tensor name */
    K_NUM,     /* double in (min, max]: a JSON number, integer or not */
    K_ROPE     /* the "rope" object (decoder.c) */
} key_type;

/* A rule on a string's content beyond its length: NULL when s is fine,
 * else why not, as words that follow the quoted value ("must be ..."). */
typedef const char *(*string_rule)(const char *s);

typedef struct {
    const char *section; /* top-level object; NULL for a model key */
    const char *key;
    key_type type;
    long long min, max;        /* value range for numbers, length range for strings */
    long long def;             /* default number or boolean */
    const char *def_str;       /* default string (NULL = none) */
    size_t off;                /* where it lands in attnd_config / attnd_model_config */
    size_t off_n;              /* K_STRLIST: where the count lands */
    const char *flag;          /* --flag that overrides it, or NULL */
    const char *env;           /* ATTND_* variable that overrides it, or NULL */
    string_rule valid;         /* K_STR, K_NAME: the rule on the content, or NULL */
    const attnd_enum *choices; /* K_STR: the words it may be (enums.h), or NULL */
    int required;              /* models only: REQUIRED = must be given */
    const char *help;          /* one line for --help; docs/config.md says the same */
} cfg_key;

enum { OPTIONAL = 0, REQUIRED = 1 };

/* The field of type T at byte offset off of the struct at base (a row's off
 * or off_n). */
#define FIELD(T, base, off) ((T *)((char *)(base) + (off)))

#define C_OFF(f) offsetof(attnd_config, f)
#define M_OFF(f) offsetof(attnd_model_config, f)

/* One row of the server table each: the section and key in the file, the
 * range, the default, the attnd_config field it lands in, its flag and its
 * variable (NULL = none), and the line --help prints. */
#define CFG_INT(sec, name, lo, hi, dflt, field, flag_, env_, help_)                                \
    {                                                                                              \
        .section = sec, .key = name, .type = K_INT, .min = lo, .max = hi, .def = dflt,             \
        .off = C_OFF(field), .flag = flag_, .env = env_, .help = help_                             \
    }
#define CFG_LL(sec, name, lo, hi, dflt, field, flag_, env_, help_)                                 \
    {                                                                                              \
        .section = sec, .key = name, .type = K_LL, .min = lo, .max = hi, .def = dflt,              \
        .off = C_OFF(field), .flag = flag_, .env = env_, .help = help_                             \
    }
#define CFG_BOOL(sec, name, dflt, field, flag_, env_, help_)                                       \
    {                                                                                              \
        .section = sec, .key = name, .type = K_BOOL, .min = 0, .max = 1, .def = dflt,              \
        .off = C_OFF(field), .flag = flag_, .env = env_, .help = help_                             \
    }
/* minlen..maxlen bytes, then valid (NULL = any content). */
#define CFG_STR(sec, name, minlen, maxlen, dflt, valid_, field, flag_, env_, help_)                \
    {                                                                                              \
        .section = sec, .key = name, .type = K_STR, .min = minlen, .max = maxlen, .def_str = dflt, \
        .valid = valid_, .off = C_OFF(field), .flag = flag_, .env = env_, .help = help_            \
    }
/* One of the words of table (enums.h); --help lists them after help_. */
#define CFG_WORD(sec, name, table, dflt, field, flag_, env_, help_)                                \
    {                                                                                              \
        .section = sec, .key = name, .type = K_STR, .min = 1, .max = 32, .def_str = dflt,          \
        .choices = &table, .off = C_OFF(field), .flag = flag_, .env = env_, .help = help_          \
    }
/* At most `most` strings of 1 to 1024 bytes; their count lands in count_field. */
#define CFG_STRLIST(sec, name, most, field, count_field, flag_, env_, help_)                       \
    {                                                                                              \
        .section = sec, .key = name, .type = K_STRLIST, .max = most, .off = C_OFF(field),          \
        .off_n = C_OFF(count_field), .flag = flag_, .env = env_, .help = help_                     \
    }

/* One row of the model table each: the key, its range, REQUIRED or
 * OPTIONAL, the attnd_model_config field it lands in, and its help. */
#define MODEL_INT(name, lo, hi, need, field, help_)                                                \
    {                                                                                              \
        .key = name, .type = K_INT, .min = lo, .max = hi, .required = need, .off = M_OFF(field),   \
        .help = help_                                                                              \
    }
/* dflt -1: settled by the layout (decoder.c). */
#define MODEL_BOOL(name, dflt, field, help_)                                                       \
    {                                                                                              \
        .key = name, .type = K_BOOL, .min = 0, .max = 1, .def = dflt, .off = M_OFF(field),         \
        .help = help_                                                                              \
    }
/* A number in (lo, hi]; 0 (not given) means the core's default. */
#define MODEL_NUM(name, lo, hi, field, help_)                                                      \
    { .key = name, .type = K_NUM, .min = lo, .max = hi, .off = M_OFF(field), .help = help_ }
#define MODEL_STR(name, minlen, maxlen, dflt, need, field, help_)                                  \
    {                                                                                              \
        .key = name, .type = K_STR, .min = minlen, .max = maxlen, .def_str = dflt,                 \
        .required = need, .off = M_OFF(field), .help = help_                                       \
    }
/* One of the words of table (enums.h). */
#define MODEL_WORD(name, table, dflt, field, help_)                                                \
    {                                                                                              \
        .key = name, .type = K_STR, .min = 1, .max = 32, .def_str = dflt, .choices = &table,       \
        .off = M_OFF(field), .help = help_                                                         \
    }
/* The model's name, in place in its char array. */
#define MODEL_NAME(name, field, help_)                                                             \
    {                                                                                              \
        .key = name, .type = K_NAME, .min = 1, .max = ATTND_NAME_MAX - 1, .valid = valid_name,     \
        .required = REQUIRED, .off = M_OFF(field), .help = help_                                   \
    }
/* An object read by its own code (K_ROLEMAP, K_ROPE). */
#define MODEL_OBJECT(name, kind, help_)                                                            \
    { .key = name, .type = kind, .help = help_ }

/* ---- the rules on string values ---- */

static const char *valid_name(const char *s) {
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-')
            return "may hold only letters, digits, '.', '_' and '-'";
    return NULL;
}

/* "" is allowed: no variable, so no API key. */
static const char *valid_envname(const char *s) {
    if (isdigit((unsigned char)*s)) return "is not an environment variable name";
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_') return "is not an environment variable name";
    return NULL;
}

/* A collector's traces endpoint: an http:// or https:// URL. */
static const char *valid_url(const char *s) {
    if (strncmp(s, "http://", 7) != 0 && strncmp(s, "https://", 8) != 0)
        return "is not an http:// or https:// URL (the collector's traces endpoint, such as "
               "http://collector:4318/v1/traces)";
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f) return "holds a space or a control character";
    return NULL;
}

/* The server settings. Ranges and defaults are documented in docs/config.md. */
static const cfg_key config_keys[] = {
    CFG_STR("server", "host", 1, 255, "0.0.0.0", NULL, host, "--host", "ATTND_HOST",
            "address to listen on"),
    CFG_INT("server", "port", 0, 65535, 8080, port, "--port", "ATTND_PORT",
            "TCP port; 0 picks a free one"),
    CFG_INT("server", "http_threads", 0, 256, 0, http_threads, "--http-threads",
            "ATTND_HTTP_THREADS",
            "HTTP polling threads; 0 = the CPUs this process may use (max 64)"),
    CFG_LL("server", "max_body_bytes", 1, 1LL << 34, 67108864, max_body_bytes, NULL,
           "ATTND_MAX_BODY_BYTES", "request body limit, bytes (413 past it)"),
    CFG_INT("server", "request_timeout_ms", 1, 3600000, 30000, request_timeout_ms, NULL,
            "ATTND_REQUEST_TIMEOUT_MS", "admission to answer, ms (504 past it)"),
    CFG_INT("server", "max_connections", 1, 1000000, 1024, max_connections, NULL,
            "ATTND_MAX_CONNECTIONS", "concurrent connections"),
    CFG_INT("server", "connection_timeout_s", 0, 86400, 30, connection_timeout_s, NULL,
            "ATTND_CONNECTION_TIMEOUT_S", "idle connection timeout, s; 0 = none"),
    CFG_INT("server", "header_timeout_ms", 100, 3600000, 10000, header_timeout_ms, NULL,
            "ATTND_HEADER_TIMEOUT_MS",
            "from a connection's start, or its last answer, to a request's last header line, ms"),
    CFG_INT("server", "body_timeout_ms", 100, 3600000, 60000, body_timeout_ms, NULL,
            "ATTND_BODY_TIMEOUT_MS", "from the last header line to the body's last byte, ms"),
    CFG_LL("server", "max_buffered_body_bytes", 1 << 20, 1LL << 40, 268435456,
           max_buffered_body_bytes, NULL, "ATTND_MAX_BUFFERED_BODY_BYTES",
           "request body bytes held at once over all connections (429 past it)"),
    CFG_INT("server", "drain_grace_s", 0, 86400, 30, drain_grace_s, NULL, "ATTND_DRAIN_GRACE_S",
            "after SIGTERM/SIGINT, how long admitted requests may take to be answered, s"),
    CFG_STR("server", "api_key_env", 0, 128, "ATTND_API_KEY", valid_envname, api_key_env,
            "--api-key-env", NULL, "env variable holding the API key; \"\" = no key"),
    CFG_STRLIST("server", "cors_origins", CORS_MAX, cors_origins, n_cors_origins, NULL,
                "ATTND_CORS_ORIGINS",
                "allowed CORS origins (env: comma-separated); empty = CORS off"),
    CFG_WORD("server", "log_format", attnd_log_formats, "text", log_format, "--log-format",
             "ATTND_LOG_FORMAT", "log lines (json: one object per line)"),
    CFG_WORD("server", "log_level", attnd_log_levels, "info", log_level, "--log-level",
             "ATTND_LOG_LEVEL", "least level logged"),
    CFG_BOOL("server", "access_log", 1, access_log, NULL, "ATTND_ACCESS_LOG",
             "one line per request (true | false)"),
    CFG_BOOL("server", "ui", 1, ui, NULL, "ATTND_UI",
             "the attention viewer page at GET /ui (true | false)"),
    CFG_INT("batching", "max_batch_tokens", 1, 1 << 24, 16384, max_batch_tokens,
            "--max-batch-tokens", "ATTND_MAX_BATCH_TOKENS", "query + key tokens per batch"),
    CFG_INT("batching", "max_batch_requests", 1, 4096, 64, max_batch_requests,
            "--max-batch-requests", "ATTND_MAX_BATCH_REQUESTS",
            "requests per batch; 1 = batching off"),
    CFG_INT("batching", "max_queue_delay_us", 0, 10000000, 0, max_queue_delay_us,
            "--max-queue-delay-us", "ATTND_MAX_QUEUE_DELAY_US",
            "while compute is idle, how long a batch waits for company, us; 0 = starts at once"),
    CFG_INT("batching", "max_queue_requests", 1, 1000000, 4096, max_queue_requests, NULL,
            "ATTND_MAX_QUEUE_REQUESTS", "queued requests per model (429 past it)"),
    CFG_INT("workers", "threads", 0, 1024, 0, worker_threads, "--workers", "ATTND_WORKERS",
            "threads of the one compute pool; 0 = the CPUs this process may use (affinity, cgroup "
            "quota)"),
    CFG_WORD("workers", "pin_threads", attnd_pins, "auto", pin_threads, NULL, "ATTND_PIN_THREADS",
             "compute threads pinned one CPU each; auto = when the pool has every CPU of the "
             "affinity mask and no smaller cgroup quota"),
    CFG_WORD("workers", "bf16_kernels", attnd_bf16_kernel_caps, "auto", bf16_kernels, NULL,
             "ATTND_BF16_KERNELS",
             "the bf16 kernels bf16 models may use: auto (the best the CPU has) or at most the "
             "one named; none computes them in fp32"),
    CFG_INT("workers", "blas_threads", 1, 256, 0, blas_threads, "--blas-threads",
            "ATTND_BLAS_THREADS",
            "obsolete: the pool gets workers.threads x this (docs/config.md)"),
    CFG_INT("limits", "max_tokens_per_request", 1, 1 << 24, 16384, max_tokens_per_request, NULL,
            "ATTND_MAX_TOKENS_PER_REQUEST", "query + key tokens of one request (413 past it)"),
    CFG_LL("limits", "max_attention_floats", 1, 1LL << 40, 16777216, max_attention_floats, NULL,
           "ATTND_MAX_ATTENTION_FLOATS", "floats of a requested attention matrix (413 past it)"),
    CFG_INT("limits", "max_sessions", 1, 1000000, 1024, max_sessions, NULL, "ATTND_MAX_SESSIONS",
            "KV-cache sessions open at once (429 past it)"),
    CFG_LL("limits", "max_session_bytes", 1, 1LL << 40, 1LL << 30, max_session_bytes, NULL,
           "ATTND_MAX_SESSION_BYTES", "bytes of all sessions' caches together (429 past it)"),
    CFG_LL("limits", "max_session_bytes_each", 1, 1LL << 40, 1LL << 28, max_session_bytes_each,
           NULL, "ATTND_MAX_SESSION_BYTES_EACH", "bytes of one session's cache (413 past it)"),
    CFG_INT("limits", "session_idle_s", 1, 86400 * 7, 300, session_idle_s, NULL,
            "ATTND_SESSION_IDLE_S", "a session unused this long ends, s"),
    CFG_STR("tracing", "otlp_endpoint", 1, 2048, NULL, valid_url, otlp_endpoint, NULL,
            "ATTND_OTLP_ENDPOINT",
            "OTLP/HTTP traces URL of a collector (http://collector:4318/v1/traces); none = no "
            "span export"),
    CFG_INT("tracing", "queue_spans", 16, 1 << 20, 2048, otlp_queue_spans, NULL,
            "ATTND_OTLP_QUEUE_SPANS", "spans held for export (dropped and counted past it)"),
    CFG_STR("sessions", "save_dir", 1, 4096, NULL, NULL, save_dir, NULL, "ATTND_SESSIONS_SAVE_DIR",
            "a draining daemon saves its sessions here, the next start loads them; none = not "
            "kept"),
};
#define N_CONFIG_KEYS (int)countof(config_keys)

/* One entry of "models". kdim, vdim, num_kv_heads, head_dim and scale
 * default to 0, meaning what nn.MultiheadAttention does; bias and causal to
 * -1, meaning the layout's default (decoder.c). */
static const cfg_key model_keys[] = {
    MODEL_NAME("name", name, "unique name, [A-Za-z0-9._-]+"),
    MODEL_INT("embed_dim", 1, 65536, REQUIRED, hp.embed_dim, "E: query and output width"),
    MODEL_INT("num_heads", 1, 65536, REQUIRED, hp.num_heads, "H: heads; must divide embed_dim"),
    MODEL_INT("kdim", 1, 65536, OPTIONAL, hp.kdim, "key input width (default embed_dim)"),
    MODEL_INT("vdim", 1, 65536, OPTIONAL, hp.vdim, "value input width (default embed_dim)"),
    MODEL_BOOL("bias", -1, hp.bias,
               "projections carry biases (default: false for layout llama, else true)"),
    MODEL_BOOL("causal", -1, hp.causal,
               "causal mask for requests that do not say (default: true for layout llama)"),
    MODEL_INT("num_kv_heads", 1, 65536, OPTIONAL, hp.num_kv_heads,
              "key/value heads (grouped-query attention); must divide num_heads"),
    MODEL_INT("head_dim", 1, 65536, OPTIONAL, hp.head_dim,
              "D: head width (default embed_dim / num_heads)"),
    MODEL_NUM("scale", 0, 1000000, hp.scale, "multiplies q k^T (default 1 / sqrt(head_dim))"),
    MODEL_OBJECT("rope", K_ROPE, "rotary positions: {theta, dim, style, scaling}"),
    MODEL_INT("max_positions", 1, 1 << 30, OPTIONAL, max_positions,
              "positions a request or session may reach (default: no limit)"),
    MODEL_STR("weights", 1, 4096, NULL, REQUIRED, weights,
              ".safetensors file; relative to the config's folder"),
    MODEL_STR("prefix", 0, 1024, "", OPTIONAL, prefix, "prepended to every tensor name"),
    MODEL_WORD("layout", attnd_layouts, "torch", layout, "how the file names the tensors"),
    MODEL_WORD("precision", attnd_precisions, "fp32", precision,
               "what it computes in: fp32, or bf16 where the CPU has AVX512-BF16 or AMX-BF16 "
               "(fp32 elsewhere, said at start-up; docs/performance.md)"),
    MODEL_OBJECT("tensors", K_ROLEMAP, "role -> tensor name, over the layout's names"),
};
#define N_MODEL_KEYS (int)countof(model_keys)

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
        for (int i = 0; i < N_CONFIG_KEYS; i++) {
            if (strcmp(config_keys[i].key, name) == 0)
                return cfg_fail(err, errlen, "%s: %s: unknown key; \"%s\" belongs in \"%s\".", src,
                                key, name, config_keys[i].section);
            if (strcmp(config_keys[i].section, section) == 0)
                cfg_nearest_try(&n, config_keys[i].key);
        }
    } else {
        for (int i = 0; i < N_MODEL_KEYS; i++)
            cfg_nearest_try(&n, model_keys[i].key);
    }
    return cfg_fail(err, errlen, "%s: %s: unknown key%s.", src, key,
                    cfg_nearest_hint(&n, "", hint, sizeof hint));
}

/* Replaces the string at *slot with a copy of s. Returns 0 or -1 (memory). */
static int set_str(char **slot, const char *s) {
    char *copy = strdup(s);
    if (!copy) return -1;
    free(*slot);
    *slot = copy;
    return 0;
}

static void free_strlist(char ***list, int *n) {
    for (int i = 0; i < *n; i++)
        free((*list)[i]);
    free(*list);
    *list = NULL;
    *n = 0;
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

/* Why s breaks k's rule on its content (words that follow the quoted
 * value, written into buf when they name k's choices), or NULL when it
 * keeps it (or k has none). */
static const char *rule_broken(const cfg_key *k, const char *s, char *buf, size_t cap) {
    int v;
    if (k->choices && attnd_enum_value(k->choices, s, &v) < 0) {
        char list[160];
        snprintf(buf, cap, "must be %s", attnd_enum_list(k->choices, " or ", list, sizeof list));
        return buf;
    }
    return k->valid ? k->valid(s) : NULL;
}

/* Checks a string value against k's length range and rules, then stores it.
 * src names where it came from (the file, a variable or a flag). */
static int store_string(void *base, const cfg_key *k, const char *s, size_t len, const char *src,
                        const char *key, char *err, size_t errlen) {
    if (memchr(s, '\0', len))
        return cfg_fail(err, errlen, "%s: %s: holds a NUL character.", src, key);
    if ((long long)len < k->min || (long long)len > k->max)
        return cfg_fail(err, errlen, "%s: %s: length %zu is out of range [%lld, %lld].", src, key,
                        len, k->min, k->max);
    char rule[200];
    const char *why = rule_broken(k, s, rule, sizeof rule);
    if (why) return cfg_fail(err, errlen, "%s: %s: \"%s\" %s.", src, key, s, why);
    if (k->type == K_NAME) {
        memcpy(FIELD(char, base, k->off), s, len + 1);
        return 0;
    }
    if (set_str(FIELD(char *, base, k->off), s) != 0)
        return cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
    return 0;
}

static int store_number(void *base, const cfg_key *k, long long v, const char *src, const char *key,
                        char *err, size_t errlen) {
    if (v < k->min || v > k->max)
        return cfg_fail(err, errlen, "%s: %s: %lld is out of range [%lld, %lld].", src, key, v,
                        k->min, k->max);
    if (k->type == K_LL)
        *FIELD(long long, base, k->off) = v;
    else
        *FIELD(int, base, k->off) = (int)v;
    return 0;
}

/* Stores a list of strings, replacing the old one. items/n are borrowed. */
static int store_strlist(void *base, const cfg_key *k, const char **items, const size_t *lens,
                         int n, const char *src, const char *key, char *err, size_t errlen) {
    char ***slot = FIELD(char **, base, k->off);
    int *count = FIELD(int, base, k->off_n);
    char **list = NULL;
    int made = 0, rc = -1;
    if (n > k->max) {
        cfg_fail(err, errlen, "%s: %s: %d entries, at most %lld allowed.", src, key, n, k->max);
        goto cleanup;
    }
    list = calloc(n ? (size_t)n : 1, sizeof *list);
    if (!list) {
        cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
        goto cleanup;
    }
    for (; made < n; made++) {
        if (lens[made] < 1 || lens[made] > 1024 || memchr(items[made], '\0', lens[made])) {
            cfg_fail(err, errlen, "%s: %s[%d]: must be a non-empty string of at most 1024 bytes.",
                     src, key, made);
            goto cleanup;
        }
        list[made] = strndup(items[made], lens[made]);
        if (!list[made]) {
            cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
            goto cleanup;
        }
    }
    free_strlist(slot, count);
    *slot = list;
    *count = n;
    list = NULL;
    rc = 0;
cleanup:
    if (list) {
        for (int i = 0; i < made; i++)
            free(list[i]);
        free(list);
    }
    return rc;
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
        if (set_str(&mc->tensors[r], json_string_value(name)) != 0)
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
    rc = store_strlist(base, k, items, lens, n, src, key, err, errlen);
cleanup:
    free(items);
    free(lens);
    return rc;
}

/* Stores a number in (min, max]. */
static int store_real(void *base, const cfg_key *k, double x, const char *src, const char *key,
                      char *err, size_t errlen) {
    if (!(x > (double)k->min && x <= (double)k->max))
        return cfg_fail(err, errlen, "%s: %s: %g is out of range (%lld, %lld].", src, key, x,
                        k->min, k->max);
    *FIELD(double, base, k->off) = x;
    return 0;
}

/* Type-checks one JSON value against its row and stores it. */
static int store_json(void *base, const cfg_key *k, json_t *v, const char *src, const char *key,
                      char *err, size_t errlen) {
    switch (k->type) {
    case K_STR:
    case K_NAME:
        if (!json_is_string(v)) break;
        return store_string(base, k, json_string_value(v), json_string_length(v), src, key, err,
                            errlen);
    case K_INT:
    case K_LL:
        if (!json_is_integer(v)) break;
        return store_number(base, k, (long long)json_integer_value(v), src, key, err, errlen);
    case K_BOOL:
        if (!json_is_boolean(v)) break;
        *FIELD(int, base, k->off) = json_is_true(v);
        return 0;
    case K_STRLIST:
        if (!json_is_array(v)) break;
        return store_json_strlist(base, k, v, src, key, err, errlen);
    case K_NUM:
        if (!json_is_number(v)) break;
        return store_real(base, k, json_number_value(v), src, key, err, errlen);
    case K_ROLEMAP:
        return store_rolemap((attnd_model_config *)base, v, src, key, err, errlen);
    case K_ROPE:
        return attnd_rope_parse((attnd_model_config *)base, v, src, key, err, errlen);
    }
    return cfg_fail(err, errlen, "%s: %s: must be %s, not %s.", src, key, type_wanted(k->type),
                    json_type_name(v));
}

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
 * maximum lets store_strlist refuse it. */
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
        return store_number(base, k, v, src, key, err, errlen);
    }
    if (k->type == K_BOOL) {
        int v = strcmp(s, "true") == 0 || strcmp(s, "1") == 0;
        if (!v && strcmp(s, "false") != 0 && strcmp(s, "0") != 0)
            return cfg_fail(err, errlen, "%s: %s: \"%s\" is not true, false, 1 or 0.", src, key, s);
        *FIELD(int, base, k->off) = v;
        return 0;
    }
    if (k->type == K_STRLIST) {
        const char *items[CORS_MAX + 1];
        size_t lens[CORS_MAX + 1];
        int n = split_commas(s, items, lens, CORS_MAX + 1);
        return store_strlist(base, k, items, lens, n, src, key, err, errlen);
    }
    return store_string(base, k, s, strlen(s), src, key, err, errlen);
}

static void key_path(char *out, size_t n, const cfg_key *k) {
    snprintf(out, n, "%s.%s", k->section, k->key);
}

static int set_default(void *base, const cfg_key *k) {
    switch (k->type) {
    case K_STR:
        return k->def_str ? set_str(FIELD(char *, base, k->off), k->def_str) : 0;
    case K_INT:
    case K_BOOL:
        *FIELD(int, base, k->off) = (int)k->def;
        return 0;
    case K_LL:
        *FIELD(long long, base, k->off) = k->def;
        return 0;
    default:
        return 0; /* the rest start as the caller zeroed them: lists, names, K_NUM, objects */
    }
}

static void model_config_free(attnd_model_config *mc) {
    free(mc->weights);
    free(mc->prefix);
    free(mc->layout);
    free(mc->precision);
    for (int r = 0; r < ROLE_COUNT; r++)
        free(mc->tensors[r]);
    memset(mc, 0, sizeof *mc);
}

static void models_free(attnd_model_config *models, int n) {
    for (int i = 0; i < n; i++)
        model_config_free(&models[i]);
    free(models);
}

int attnd_config_defaults(attnd_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_CONFIG_KEYS; i++) {
        if (set_default(c, &config_keys[i]) != 0) {
            attnd_config_free(c);
            return -1;
        }
    }
    return 0;
}

void attnd_config_free(attnd_config *c) {
    if (!c) return;
    free(c->host);
    free(c->api_key_env);
    free(c->log_format);
    free(c->bf16_kernels);
    free(c->log_level);
    free(c->pin_threads);
    free(c->otlp_endpoint);
    free(c->save_dir);
    free_strlist(&c->cors_origins, &c->n_cors_origins);
    models_free(c->models, c->n_models);
    free(c->config_path);
    memset(c, 0, sizeof *c);
}

/* The folder part of path with a trailing '/', or "" when it has none. */
static char *folder_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return strndup(path, slash ? (size_t)(slash - path + 1) : 0);
}

/* Checks that mc's weights file can be opened and is a regular file. */
static int weights_readable(const attnd_model_config *mc, const char *src, const char *key,
                            char *err, size_t errlen) {
    int fd = open(mc->weights, O_RDONLY | O_CLOEXEC);
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

/* Resolves mc->weights against dir and, with check_files, checks that it
 * can be read. */
static int resolve_weights(attnd_model_config *mc, const char *dir, int check_files,
                           const char *src, const char *key, char *err, size_t errlen) {
    if (mc->weights[0] != '/' && dir[0]) {
        size_t n = strlen(dir) + strlen(mc->weights) + 1;
        char *full = malloc(n);
        if (!full) return cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
        snprintf(full, n, "%s%s", dir, mc->weights);
        free(mc->weights);
        mc->weights = full;
    }
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

/* Reads one entry of "models" into mc (zeroed by the caller). */
static int parse_model(attnd_model_config *mc, json_t *obj, int idx, const char *dir,
                       int check_files, const char *src, char *err, size_t errlen) {
    char key[160];
    int given[N_MODEL_KEYS] = {0};
    snprintf(key, sizeof key, "models[%d]", idx);
    if (!json_is_object(obj))
        return cfg_fail(err, errlen, "%s: %s: must be an object, not %s.", src, key,
                        json_type_name(obj));
    for (int i = 0; i < N_MODEL_KEYS; i++)
        if (set_default(mc, &model_keys[i]) != 0)
            return cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        int i = 0;
        while (i < N_MODEL_KEYS && strcmp(model_keys[i].key, name) != 0)
            i++;
        snprintf(key, sizeof key, "models[%d].%.100s", idx, name);
        if (i == N_MODEL_KEYS) return no_such_key(NULL, name, src, key, err, errlen);
        if (store_json(mc, &model_keys[i], v, src, key, err, errlen) != 0)
            return in_model(obj, err, errlen);
        given[i] = 1;
    }
    for (int i = 0; i < N_MODEL_KEYS; i++)
        if (model_keys[i].required && !given[i])
            return cfg_fail(err, errlen, "%s: models[%d].%s: missing; every model needs it.", src,
                            idx, model_keys[i].key);
    if (attnd_model_check(mc, idx, src, err, errlen) != 0) return -1;
    snprintf(key, sizeof key, "models[%d].weights", idx);
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
        if (parse_model(mc, json_array_get(arr, (size_t)n), n, dir, check_files, src, err,
                        errlen) != 0) {
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
    models_free(c->models, c->n_models);
    c->models = models;
    c->n_models = n;
    models = NULL;
    n = 0;
    rc = 0;
cleanup:
    models_free(models, n);
    return rc;
}

static int parse_section(attnd_config *c, const char *section, json_t *obj, const char *src,
                         char *err, size_t errlen) {
    if (!json_is_object(obj))
        return cfg_fail(err, errlen, "%s: %s: must be an object, not %s.", src, section,
                        json_type_name(obj));
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        char key[160];
        snprintf(key, sizeof key, "%s.%.100s", section, name);
        const cfg_key *k = NULL;
        for (int i = 0; i < N_CONFIG_KEYS && !k; i++)
            if (strcmp(config_keys[i].section, section) == 0 &&
                strcmp(config_keys[i].key, name) == 0)
                k = &config_keys[i];
        if (!k) return no_such_key(section, name, src, key, err, errlen);
        if (store_json(c, k, v, src, key, err, errlen) != 0) return -1;
    }
    return 0;
}

int attnd_config_load_mem(attnd_config *c, const char *text, size_t len, const char *file,
                          int check_files, char *err, size_t errlen) {
    json_error_t jerr;
    json_t *root = NULL;
    char *dir = NULL;
    int rc = -1;
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
    dir = folder_of(file);
    if (!dir || set_str(&c->config_path, file) != 0) {
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
                      : parse_section(c, name, v, file, err, errlen);
        if (bad) goto cleanup;
    }
    rc = 0;
cleanup:
    free(dir);
    json_decref(root);
    return rc;
}

static int load_file(attnd_config *c, const char *path, int check_files, char *err, size_t errlen) {
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
    return load_file(c, path, 1, err, errlen);
}

/* Adds the embedded default model (weights == NULL). */
static int add_default_model(attnd_config *c, char *err, size_t errlen) {
    attnd_model_config *mc = calloc(1, sizeof *mc);
    if (!mc) return cfg_fail(err, errlen, "out of memory.");
    snprintf(mc->name, sizeof mc->name, "default");
    attnd_default_hparams(&mc->hp);
    if (set_str(&mc->prefix, "") != 0 || set_str(&mc->layout, "torch") != 0) {
        models_free(mc, 1);
        return cfg_fail(err, errlen, "out of memory.");
    }
    models_free(c->models, c->n_models);
    c->models = mc;
    c->n_models = 1;
    return 0;
}

static const cfg_key *find_flag(const char *flag, size_t len) {
    for (int i = 0; i < N_CONFIG_KEYS; i++)
        if (config_keys[i].flag && strlen(config_keys[i].flag) == len &&
            strncmp(config_keys[i].flag, flag, len) == 0)
            return &config_keys[i];
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
    for (int i = 0; i < N_CONFIG_KEYS && !k; i++)
        if (strcmp(config_keys[i].key, name) == 0 && config_keys[i].section) k = &config_keys[i];
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
    return val && *val && !rule_broken(k, val, rule, sizeof rule) ? val : NULL;
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
    for (int k = 0; k < N_CONFIG_KEYS; k++)
        if (config_keys[k].flag) cfg_nearest_try(&n, config_keys[k].flag + 2);
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

/* Stores every ATTND_* variable that is set and not empty. */
static int apply_env(attnd_config *c, char *err, size_t errlen) {
    char src[200], key[160];
    for (int i = 0; i < N_CONFIG_KEYS; i++) {
        const cfg_key *k = &config_keys[i];
        const char *env = k->env ? getenv(k->env) : NULL;
        if (!env || !*env) continue; /* empty = unset, as Docker's "VAR=" means */
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

/* Checks that every model's weights file can be opened; config_file names
 * where the models came from. */
static int models_readable(const attnd_config *c, const char *config_file, char *err,
                           size_t errlen) {
    char key[160];
    for (int i = 0; i < c->n_models; i++) {
        snprintf(key, sizeof key, "models[%d].weights", i);
        if (c->models[i].weights &&
            weights_readable(&c->models[i], config_file, key, err, errlen) != 0)
            return -1;
    }
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
    /* defaults < config file < ATTND_* variables < flags */
    if (config_file && load_file(c, config_file, 0, err, errlen) != 0) goto fail;
    if (apply_env(c, err, errlen) != 0 || apply_flags(c, argc, argv, err, errlen) != 0) goto fail;
    if (c->n_models == 0 && add_default_model(c, err, errlen) != 0) goto fail;
    /* the config is sound; what is left is the weights files' business */
    if (models_readable(c, config_file, err, errlen) != 0) {
        attnd_config_free(c);
        return -2;
    }
    return 0;
fail:
    attnd_config_free(c);
    return -1;
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
    for (int i = 0; i < N_CONFIG_KEYS; i++) {
        const cfg_key *k = &config_keys[i];
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
    for (int i = 0; i < N_CONFIG_KEYS; i++) {
        const cfg_key *k = &config_keys[i];
        if (!k->env) continue;
        char def[64];
        if (k->type == K_STR && !k->def_str)
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
