/* config.h - what attnd serves and how: the JSON config file, the flags and
 * ATTND_* environment variables that override it, and the models it names.
 * It includes weights.h, which defines a model's config and loads its
 * weights (attnd_model_load), so the server needs only this header.
 * It reads files and the environment; it never listens, computes attention
 * or exits (only main() exits).
 * Four files define it, each calling only the ones before it: keys.c (the
 * table of keys, the defaults, attnd_config_free, a model entry's copy,
 * comparison and freeing, the keys that differ between two configs),
 * confine.c (paths kept inside the model folder), read.c (the file, and
 * one model entry given as JSON text) and env.c (the variables and flags
 * over it, attnd_config_from_args, attnd_config_reread, --help).
 */
#ifndef ATTND_CONFIG_H
#define ATTND_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "enums.h"
#include "weights.h"

/* The version --version prints, /v2 and /metrics show. */
#define ATTND_VERSION "0.2.0"

typedef struct {
    /* server */
    char *host;                        /* "0.0.0.0" */
    int port;                          /* 8080; 0 = pick a free port (tests) */
    int grpc_port;                     /* 8081; 0 = no gRPC; -1 = pick a free port (tests) */
    int http_threads;                  /* HTTP polling threads as read; 0 = auto */
    int http_pollers;                  /* http_threads resolved (server/base/cpus.c) */
    long long max_body_bytes;          /* request body limit, bytes -> 413 */
    int request_timeout_ms;            /* admission to answer; past it -> 504 */
    int max_connections;               /* concurrent connections accepted */
    int connection_timeout_s;          /* idle connection timeout, seconds */
    int header_timeout_ms;             /* connection start or last answer -> end of headers, ms */
    int body_timeout_ms;               /* end of headers -> last body byte, ms */
    long long max_buffered_body_bytes; /* body bytes held over all connections -> 429 */
    int drain_grace_s;                 /* SIGTERM -> requests cut short and exit 5, seconds */
    char *api_key_env;                 /* name of the env variable holding the API key */
    char **cors_origins;               /* allowed origins; n_cors_origins == 0 = CORS off */
    int n_cors_origins;
    char *log_format;     /* "text" | "json" */
    char *log_level;      /* "debug" | "info" | "warn" | "error": the least level logged */
    int access_log;       /* 1: one line per request */
    int ui;               /* 1: GET /ui serves the attention viewer (docs/ui.md); 0: 404 */
    char *model_control;  /* "none" | "explicit": whether the repository routes may load
                             and unload models (SPEC section 12) */
    int explicit_control; /* model_control resolved by attnd_config_from_args and
                             attnd_config_reread: 1 = "explicit"; 0 otherwise */
    char *model_dir;      /* the folder a repository load's weights must lie in
                             (attnd_path_confine). Set by attnd_config_from_args and
                             attnd_config_reread always: absolute, symbolic links resolved;
                             the config file's folder (cwd without one) when not given */
    /* batching */
    int max_batch_tokens;   /* query + key tokens per batch */
    int max_batch_requests; /* 1 = batching off */
    int max_queue_delay_us; /* while compute is idle, how long a batch waits for company */
    int max_queue_requests; /* queued requests per model; past it -> 429 */
    /* workers */
    int worker_threads; /* threads of the one compute pool as read; 0 = auto */
    int blas_threads;   /* obsolete; 0 = not given, else the pool gets worker_threads x this */
    /* worker_threads and blas_threads resolved (server/base/cpus.c): the pool's
     * threads. The keys keep what was read, so that a reload compares like
     * with like (attnd_config_changed_keys). */
    int compute_threads;
    char *pin_threads;  /* "auto" | "on" | "off": compute threads pinned one CPU each */
    int pin;            /* pin_threads resolved (server/base/cpus.c): 1 = pinned */
    char *bf16_kernels; /* a word of attnd_bf16_kernel_caps: "auto" | "amx-bf16" |
                           "avx512-bf16" | "none" (attn_set_bf16_kernels) */
    char *int8_kernels; /* a word of attnd_int8_kernel_caps: "auto" | "amx-int8" |
                           "avx512-vnni" | "avx-vnni" | "none" (attn_set_int8_kernels) */
    /* limits */
    int max_tokens_per_request;       /* query + key tokens -> 413 */
    long long max_attention_floats;   /* floats of a requested attention matrix -> 413 */
    int max_sessions;                 /* KV-cache sessions open at once -> 429 */
    long long max_session_bytes;      /* all sessions' caches, bytes -> 429 */
    long long max_session_bytes_each; /* one session's cache, bytes -> 413 */
    int session_idle_s;               /* a session unused this long ends, seconds */
    long long max_model_bytes;        /* weights held, every model and every version still
                                         loaded, bytes; 0 = no limit (the registry holds it) */
    /* tracing */
    char *otlp_endpoint;  /* the collector's OTLP/HTTP traces URL; NULL = no span export */
    int otlp_queue_spans; /* spans held for export; what does not fit is dropped, counted */
    /* sessions */
    char *save_dir; /* a draining daemon saves its sessions here and the next start loads
                       them; NULL = sessions end with the process (docs/deploy.md) */
    /* models */
    attnd_model_config *models;
    int n_models;
    /* where it came from */
    char *config_path; /* NULL when no config file */
    int argc;          /* main()'s arguments as attnd_config_from_args saw them, for
                          attnd_config_reread; borrowed (they live as long as the process) */
    char **argv;       /* 0 and NULL for a config made otherwise */
} attnd_config;

/* Fills every default (and no models). Returns 0 or -1 (out of memory). */
int attnd_config_defaults(attnd_config *c);

/* Parses a config file over the defaults. Unknown keys, wrong types and out
 * of range values are refused: err names the file, the key and the reason. */
int attnd_config_load_file(attnd_config *c, const char *path, char *err, size_t errlen);

/* Parses config JSON held in memory as if read from `file` (whose folder
 * resolves weight paths); check_files = 0 skips the weights-exist check
 * (fuzzing). Same contract as attnd_config_load_file. */
int attnd_config_load_mem(attnd_config *c, const char *text, size_t len, const char *file,
                          int check_files, char *err, size_t errlen);

/* What attnd_config_from_args found instead of a run: --help or --version. */
enum { ATTND_WANT_RUN = 0, ATTND_WANT_HELP = 1, ATTND_WANT_VERSION = 2 };

/* The whole start-up road: defaults, then the file from --config or
 * ATTND_CONFIG, then ATTND_* variables, then flags; with no model
 * configured, the embedded default model. Sets *want_help to
 * ATTND_WANT_HELP or ATTND_WANT_VERSION when --help or --version was given
 * (and reads nothing else). Returns 0; -1 with err set when the config,
 * a flag or a variable is wrong; -2 with err set when a model's weights
 * file cannot be opened (the config itself is sound). */
int attnd_config_from_args(attnd_config *c, int argc, char **argv, int *want_help, char *err,
                           size_t errlen);

/* The start-up road again, for SIGHUP and for a repository load without a
 * body: defaults, the config file running was read from (none: the
 * embedded default model, as at start), the ATTND_* variables and
 * running's flags, into fresh (zeroed by the caller), without opening any
 * weights file (a missing one is its model's failure, not the config's).
 * Returns 0, or -1 with err set as attnd_config_from_args sets it (fresh
 * then holds nothing). */
int attnd_config_reread(const attnd_config *running, attnd_config *fresh, char *err, size_t errlen);

/* Calls each(section, key, arg) for every key of the sections "server" to
 * "sessions" (not "models") whose value differs between a and b, in the
 * table's order: what a reload leaves as it was and the log names. */
void attnd_config_changed_keys(const attnd_config *a, const attnd_config *b,
                               void (*each)(const char *section, const char *key, void *arg),
                               void *arg);

/* path confined to the folder dir: a relative path is taken from dir; a
 * path with a ".." component is refused outright; then the file it names,
 * symbolic links resolved, must exist inside dir (symbolic links in dir
 * resolved too). On success *resolved is that file's absolute path
 * (malloc'd, the caller frees it). Returns 0; -1 with err one sentence
 * naming the path and the folder (server.model_dir) and *resolved NULL
 * when the path leaves the folder; -2 the same when it stays inside but
 * names no file that opens. */
int attnd_path_confine(const char *dir, const char *path, char **resolved, char *err,
                       size_t errlen);

/* One entry of "models" given as JSON text (a repository load's
 * parameters.config, SPEC section 12): the keys and checks of the config
 * file's entries. "name" may be left out (it is then name, the {name} of
 * the route) and must equal name when given. The weights path is confined
 * to model_dir (attnd_path_confine: a relative path is taken from it) and
 * the file must open. mc is zeroed by the caller. Returns 0, or -1 with
 * err naming "parameters.config", the key and the reason, and mc emptied;
 * -2 the same when only the weights file failed: the entry is sound, its
 * path inside model_dir, and its file missing or unreadable (a load that
 * fails, where -1 asks for nothing that could load). */
int attnd_model_entry_parse(const char *text, size_t len, const char *name, const char *model_dir,
                            attnd_model_config *mc, char *err, size_t errlen);

/* A deep copy of src into dst (whose old contents are not freed). Returns
 * 0, or -1 when out of memory (dst then holds nothing to free). */
int attnd_model_config_copy(attnd_model_config *dst, const attnd_model_config *src);
/* 1 when a and b describe the same model: every key (hyper-parameters with
 * the decoder options, weights path, prefix, layout, precision, tensors
 * map, max_positions) equal after resolution; 0 otherwise. The weights
 * file's bytes are not compared. */
int attnd_model_config_equal(const attnd_model_config *a, const attnd_model_config *b);
/* Frees one entry's strings and zeroes it (a zeroed entry is fine). */
void attnd_model_config_free(attnd_model_config *mc);

/* log_format and log_level as --log-format / --log-level or
 * ATTND_LOG_FORMAT / ATTND_LOG_LEVEL give them, before anything else is
 * read, so that a refused config is already logged in the format asked for;
 * "text" and "info" when not given (or not valid: attnd_config_from_args
 * then refuses them). The strings are argv's or the environment's. */
void attnd_config_log_early(int argc, char **argv, const char **format, const char **level);

/* note(arg, sentence) once for each ATTND_* variable set that attnd does
 * not read (a name no key has, nor server.api_key_env), and for each
 * service link that Kubernetes or Docker set over one of attnd's port
 * variables (ATTND_PORT=tcp://ADDR:PORT from a Service named "attnd"),
 * which attnd_config_from_args leaves out. A service link's other
 * variables (ATTND_SERVICE_HOST, ...) say nothing. */
void attnd_config_env_notes(const attnd_config *c, void (*note)(void *arg, const char *sentence),
                            void *arg);

/* Prints the flags and environment variables (attnd --help). */
void attnd_config_usage(FILE *f, const char *argv0);

void attnd_config_free(attnd_config *c); /* safe on a zeroed config */

#endif
