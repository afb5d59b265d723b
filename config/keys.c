/* keys.c - the table of config keys: every server setting and every key
 * of a model is one row (name, type, range, default, where it lands, its
 * env variable and flag, its --help line), so a key is added by adding a
 * row. Also the stores that check a value against its row and land it, the
 * defaults and the freeing of an attnd_config, and what walks the rows of a
 * struct: a model entry's copy, comparison and freeing, and the server keys
 * that differ between two configs.
 * It parses no JSON and reads no file, variable or flag: read.c and env.c
 * hand it values already taken apart.
 */
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "enums.h"
#include "keys.h"
#include "refuse.h"

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
/* A folder's path of 1 to 4096 bytes that must name a folder when given; a
 * relative one in the file is taken from the file's folder. dflt says in
 * words what holds when it is not given. */
#define CFG_FOLDER(sec, name, dflt, field, flag_, env_, help_)                                     \
    {                                                                                              \
        .section = sec, .key = name, .type = K_STR, .min = 1, .max = 4096, .def_words = dflt,      \
        .valid = valid_folder, .file_relative = 1, .off = C_OFF(field), .flag = flag_,             \
        .env = env_, .help = help_                                                                 \
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

/* A folder that exists: refused at start-up, with the file, variable or flag
 * that gave it, rather than at the first model load. */
static const char *valid_folder(const char *s) {
    struct stat st;
    if (stat(s, &st) != 0)
        return errno == ENOENT    ? "does not exist"
               : errno == EACCES  ? "cannot be entered (permission denied)"
               : errno == ENOTDIR ? "is not a folder"
                                  : "cannot be opened as a folder";
    return S_ISDIR(st.st_mode) ? NULL : "is not a folder";
}

/* The server settings. Ranges and defaults are documented in docs/config.md. */
const cfg_key cfg_config_keys[] = {
    CFG_STR("server", "host", 1, 255, "0.0.0.0", NULL, host, "--host", "ATTND_HOST",
            "address to listen on"),
    CFG_INT("server", "port", 0, 65535, 8080, port, "--port", "ATTND_PORT",
            "TCP port; 0 picks a free one"),
    CFG_INT("server", "grpc_port", -1, 65535, 8081, grpc_port, "--grpc-port", "ATTND_GRPC_PORT",
            "gRPC port (KServe v2 over gRPC); 0 turns gRPC off, -1 picks a free one"),
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
    CFG_STRLIST("server", "cors_origins", CFG_CORS_MAX, cors_origins, n_cors_origins, NULL,
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
    CFG_WORD("server", "model_control", attnd_model_controls, "none", model_control,
             "--model-control", "ATTND_MODEL_CONTROL",
             "whether POST /v2/repository/models/{name}/load and /unload may change the models"),
    CFG_FOLDER("server", "model_dir", "the config file's folder", model_dir, "--model-dir",
               "ATTND_MODEL_DIR", "the folder a repository load's weights must lie in"),
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
    CFG_WORD("workers", "int8_kernels", attnd_int8_kernel_caps, "auto", int8_kernels, NULL,
             "ATTND_INT8_KERNELS",
             "the int8 kernels int8 models may use: auto (the best the CPU has) or at most the "
             "one named; none computes them in bf16 (fp32 without bf16 kernels)"),
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
    CFG_LL("limits", "max_model_bytes", 0, 1LL << 50, 0, max_model_bytes, NULL,
           "ATTND_MAX_MODEL_BYTES",
           "bytes of weights held, every model and old versions still serving; 0 = no limit "
           "(a load past it is refused)"),
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
const int cfg_n_config_keys = (int)countof(cfg_config_keys);

/* One entry of "models". kdim, vdim, num_kv_heads, head_dim and scale
 * default to 0, meaning what nn.MultiheadAttention does; bias and causal to
 * -1, meaning the layout's default (decoder.c). */
const cfg_key cfg_model_keys[] = {
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
const int cfg_n_model_keys = (int)countof(cfg_model_keys);
_Static_assert(countof(cfg_model_keys) <= CFG_MODEL_KEYS_MAX, "raise CFG_MODEL_KEYS_MAX");

/* Replaces the string at *slot with a copy of s. Returns 0 or -1 (memory). */
int cfg_set_str(char **slot, const char *s) {
    char *copy = strdup(s);
    if (!copy) return -1;
    free(*slot);
    *slot = copy;
    return 0;
}

void cfg_free_strlist(char ***list, int *n) {
    for (int i = 0; i < *n; i++)
        free((*list)[i]);
    free(*list);
    *list = NULL;
    *n = 0;
}

/* Why s breaks k's rule on its content (words that follow the quoted
 * value, written into buf when they name k's choices), or NULL when it
 * keeps it (or k has none). */
const char *cfg_rule_broken(const cfg_key *k, const char *s, char *buf, size_t cap) {
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
int cfg_store_string(void *base, const cfg_key *k, const char *s, size_t len, const char *src,
                     const char *key, char *err, size_t errlen) {
    if (memchr(s, '\0', len))
        return cfg_fail(err, errlen, "%s: %s: holds a NUL character.", src, key);
    if ((long long)len < k->min || (long long)len > k->max)
        return cfg_fail(err, errlen, "%s: %s: length %zu is out of range [%lld, %lld].", src, key,
                        len, k->min, k->max);
    char rule[200];
    const char *why = cfg_rule_broken(k, s, rule, sizeof rule);
    if (why) return cfg_fail(err, errlen, "%s: %s: \"%s\" %s.", src, key, s, why);
    if (k->type == K_NAME) {
        memcpy(FIELD(char, base, k->off), s, len + 1);
        return 0;
    }
    if (cfg_set_str(FIELD(char *, base, k->off), s) != 0)
        return cfg_fail(err, errlen, "%s: %s: out of memory.", src, key);
    return 0;
}

int cfg_store_number(void *base, const cfg_key *k, long long v, const char *src, const char *key,
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
int cfg_store_strlist(void *base, const cfg_key *k, const char **items, const size_t *lens, int n,
                      const char *src, const char *key, char *err, size_t errlen) {
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
    cfg_free_strlist(slot, count);
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

/* Stores a number in (min, max]. */
int cfg_store_real(void *base, const cfg_key *k, double x, const char *src, const char *key,
                   char *err, size_t errlen) {
    if (!(x > (double)k->min && x <= (double)k->max))
        return cfg_fail(err, errlen, "%s: %s: %g is out of range (%lld, %lld].", src, key, x,
                        k->min, k->max);
    *FIELD(double, base, k->off) = x;
    return 0;
}

int cfg_set_default(void *base, const cfg_key *k) {
    switch (k->type) {
    case K_STR:
        return k->def_str ? cfg_set_str(FIELD(char *, base, k->off), k->def_str) : 0;
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

/* A model entry's strings are its K_STR rows and its tensors map: the
 * table says which, so a string key added is freed, copied and compared. */
void attnd_model_config_free(attnd_model_config *mc) {
    for (int i = 0; i < cfg_n_model_keys; i++)
        if (cfg_model_keys[i].type == K_STR) free(*FIELD(char *, mc, cfg_model_keys[i].off));
    for (int r = 0; r < ROLE_COUNT; r++)
        free(mc->tensors[r]);
    memset(mc, 0, sizeof *mc);
}

void cfg_models_free(attnd_model_config *models, int n) {
    for (int i = 0; i < n; i++)
        attnd_model_config_free(&models[i]);
    free(models);
}

/* A copy of s, NULL staying NULL; -1 when out of memory. */
static int dup_or_null(char **dst, const char *s) {
    *dst = s ? strdup(s) : NULL;
    return s && !*dst ? -1 : 0;
}

int attnd_model_config_copy(attnd_model_config *dst, const attnd_model_config *src) {
    *dst = *src;
    /* dst shares src's strings until each is copied: forget them first, so
     * that a failure part way frees only dst's own */
    for (int i = 0; i < cfg_n_model_keys; i++)
        if (cfg_model_keys[i].type == K_STR) *FIELD(char *, dst, cfg_model_keys[i].off) = NULL;
    memset(dst->tensors, 0, sizeof dst->tensors);
    int bad = 0;
    for (int i = 0; i < cfg_n_model_keys && !bad; i++)
        if (cfg_model_keys[i].type == K_STR)
            bad = dup_or_null(FIELD(char *, dst, cfg_model_keys[i].off),
                              *FIELD(char *, src, cfg_model_keys[i].off));
    for (int r = 0; r < ROLE_COUNT && !bad; r++)
        bad = dup_or_null(&dst->tensors[r], src->tensors[r]);
    if (bad) attnd_model_config_free(dst);
    return bad ? -1 : 0;
}

static int str_equal(const char *a, const char *b) {
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* 1 when row k's value is the same in the structs at a and b, compared by
 * the row's type (the objects K_ROLEMAP and K_ROPE have no offset: their
 * owners compare them). */
static int row_equal(const void *a, const void *b, const cfg_key *k) {
    switch (k->type) {
    case K_STR:
        return str_equal(*FIELD(char *, a, k->off), *FIELD(char *, b, k->off));
    case K_NAME:
        return strcmp(FIELD(char, a, k->off), FIELD(char, b, k->off)) == 0;
    case K_INT:
    case K_BOOL:
        return *FIELD(int, a, k->off) == *FIELD(int, b, k->off);
    case K_LL:
        return *FIELD(long long, a, k->off) == *FIELD(long long, b, k->off);
    case K_NUM:
        return *FIELD(double, a, k->off) == *FIELD(double, b, k->off);
    case K_STRLIST: {
        int n = *FIELD(int, a, k->off_n);
        if (n != *FIELD(int, b, k->off_n)) return 0;
        for (int i = 0; i < n; i++)
            if (!str_equal((*FIELD(char **, a, k->off))[i], (*FIELD(char **, b, k->off))[i]))
                return 0;
        return 1;
    }
    default:
        return 0; /* never asked: an object is not a row's field */
    }
}

static int rope_equal(const attn_rope *a, const attn_rope *b) {
    return a->dim == b->dim && a->theta == b->theta && a->style == b->style &&
           a->scaling == b->scaling && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
           a->original_max_position == b->original_max_position && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->mscale == b->mscale &&
           a->mscale_all_dim == b->mscale_all_dim && a->attention_factor == b->attention_factor &&
           a->exact_range == b->exact_range;
}

int attnd_model_config_equal(const attnd_model_config *a, const attnd_model_config *b) {
    for (int i = 0; i < cfg_n_model_keys; i++) {
        const cfg_key *k = &cfg_model_keys[i];
        if (k->type != K_ROLEMAP && k->type != K_ROPE && !row_equal(a, b, k)) return 0;
    }
    for (int r = 0; r < ROLE_COUNT; r++)
        if (!str_equal(a->tensors[r], b->tensors[r])) return 0;
    /* what attnd_model_check settles from the keys, compared too: a config
     * made by hand (the embedded default) may hold them alone */
    return rope_equal(&a->hp.rope, &b->hp.rope) && a->hp.precision == b->hp.precision;
}

void attnd_config_changed_keys(const attnd_config *a, const attnd_config *b,
                               void (*each)(const char *section, const char *key, void *arg),
                               void *arg) {
    for (int i = 0; i < cfg_n_config_keys; i++)
        if (!row_equal(a, b, &cfg_config_keys[i]))
            each(cfg_config_keys[i].section, cfg_config_keys[i].key, arg);
}

int attnd_config_defaults(attnd_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < cfg_n_config_keys; i++) {
        if (cfg_set_default(c, &cfg_config_keys[i]) != 0) {
            attnd_config_free(c);
            return -1;
        }
    }
    return 0;
}

void attnd_config_free(attnd_config *c) {
    if (!c) return;
    /* by the table, so that a string key added is freed */
    for (int i = 0; i < cfg_n_config_keys; i++) {
        const cfg_key *k = &cfg_config_keys[i];
        if (k->type == K_STR) free(*FIELD(char *, c, k->off));
        if (k->type == K_STRLIST)
            cfg_free_strlist(FIELD(char **, c, k->off), FIELD(int, c, k->off_n));
    }
    cfg_models_free(c->models, c->n_models);
    free(c->config_path);
    memset(c, 0, sizeof *c);
}
