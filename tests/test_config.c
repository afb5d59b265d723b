/* test_config.c - the config file, the ATTND_* variables and the flags
 * (config/keys.c, config/read.c, config/env.c).
 *
 *   defaults     every key has its documented default; no config gives one
 *                model "default" with weights == NULL.
 *   file         every key lands in its field; relative weight paths resolve
 *                against the config's folder; kdim/vdim default to E.
 *   precedence   defaults < file < env < flags, ATTND_CONFIG vs --config.
 *   refused      temp configs with one fault each (wrong type, out of range,
 *                unknown key, E not divisible by H, duplicate names, missing
 *                weights file, ...), checking that each message names the
 *                file, the key and the reason.
 *   model folder server.model_dir: its default (the config's folder, or the
 *                working directory), a relative value from the file, a
 *                variable or a flag, resolved to an absolute path; a
 *                missing folder refused; server.model_control resolved.
 * The model entries on their own, attnd_path_confine and the reload road
 * are test_config_repo.c's.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../config/config.h"
#include "check_run.h"

static char g_dir[256];     /* a fresh folder per test */
static char g_weights[512]; /* g_dir/sub/w.safetensors, an empty file */
static char g_cfg[512];     /* g_dir/sub/c.json */

/* Variables a test may set; cleared around every test. */
static const char *const env_vars[] = {
    "ATTND_CONFIG",       "ATTND_HOST",
    "ATTND_PORT",         "ATTND_WORKERS",
    "ATTND_HTTP_THREADS", "ATTND_BLAS_THREADS",
    "ATTND_CORS_ORIGINS", "ATTND_MAX_BATCH_REQUESTS",
    "ATTND_LOG_FORMAT",   "ATTND_LOG_LEVEL",
    "ATTND_BF16_KERNELS", "ATTND_MODEL_CONTROL",
    "ATTND_MODEL_DIR",    "ATTND_MAX_MODEL_BYTES",
};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++)
        unsetenv(env_vars[i]);
}

static void setup(void) {
    char sub[300];
    clear_env();
    snprintf(g_dir, sizeof g_dir, "/tmp/attnd-cfg-XXXXXX");
    ck_assert(mkdtemp(g_dir) != NULL);
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    ck_assert(mkdir(sub, 0700) == 0);
    snprintf(g_weights, sizeof g_weights, "%s/w.safetensors", sub);
    snprintf(g_cfg, sizeof g_cfg, "%s/c.json", sub);
    FILE *f = fopen(g_weights, "w");
    ck_assert(f && fclose(f) == 0);
}

static void teardown(void) {
    char sub[300];
    clear_env();
    unlink(g_cfg);
    unlink(g_weights);
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    rmdir(sub);
    rmdir(g_dir);
}

static void write_cfg(const char *text) {
    FILE *f = fopen(g_cfg, "w");
    ck_assert(f != NULL);
    ck_assert(fputs(text, f) >= 0);
    ck_assert(fclose(f) == 0);
}

/* A model entry reading w.safetensors next to the config. */
#define MODEL(name, e, h)                                                                          \
    "{\"name\":\"" name "\",\"embed_dim\":" #e ",\"num_heads\":" #h                                \
    ",\"weights\":\"w.safetensors\"}"

/* Loads text as g_cfg and expects a refusal whose message names the file
 * and holds each of the (up to two) fragments. */
static void expect_refused(const char *text, const char *key, const char *why) {
    char err[512];
    attnd_config c;
    write_cfg(text);
    ck_assert(attnd_config_defaults(&c) == 0);
    int rc = attnd_config_load_file(&c, g_cfg, err, sizeof err);
    attnd_config_free(&c);
    ck_assert_msg(rc == -1, "accepted: %s", text);
    ck_assert_msg(strstr(err, g_cfg) != NULL, "message does not name the file: %s", err);
    ck_assert_msg(!key || strstr(err, key), "message \"%s\" lacks the key \"%s\"", err, key);
    ck_assert_msg(!why || strstr(err, why), "message \"%s\" lacks the reason \"%s\"", err, why);
}

static int from_args(attnd_config *c, int argc, char **argv, char *err, size_t errlen) {
    int help = 0;
    int rc = attnd_config_from_args(c, argc, argv, &help, err, errlen);
    ck_assert(help == 0);
    return rc;
}

/* ------------------------------------------------------------ defaults */

START_TEST(defaults) {
    attnd_config c;
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_str_eq(c.host, "0.0.0.0");
    ck_assert_int_eq(c.port, 8080);
    ck_assert_int_eq(c.http_threads, 0); /* auto: from the CPUs (server/base/cpus.c) */
    ck_assert(c.max_body_bytes == 67108864);
    ck_assert_int_eq(c.request_timeout_ms, 30000);
    ck_assert_int_eq(c.max_connections, 1024);
    ck_assert_int_eq(c.connection_timeout_s, 30);
    ck_assert_str_eq(c.api_key_env, "ATTND_API_KEY");
    ck_assert_int_eq(c.n_cors_origins, 0);
    ck_assert_int_eq(c.max_batch_tokens, 16384);
    ck_assert_int_eq(c.max_batch_requests, 64);
    ck_assert_int_eq(c.max_queue_delay_us, 0);
    ck_assert_int_eq(c.max_queue_requests, 4096);
    ck_assert_int_eq(c.worker_threads, 0); /* auto: from the CPUs */
    ck_assert_int_eq(c.blas_threads, 0);   /* obsolete: not given */
    ck_assert_int_eq(c.max_tokens_per_request, 16384);
    ck_assert(c.max_attention_floats == 16777216);
    ck_assert_int_eq(c.max_sessions, 1024);
    ck_assert(c.max_session_bytes == 1LL << 30);
    ck_assert(c.max_session_bytes_each == 1LL << 28);
    ck_assert_int_eq(c.session_idle_s, 300);
    ck_assert_str_eq(c.model_control, "none");
    ck_assert_int_eq(c.explicit_control, 0);
    ck_assert(c.model_dir == NULL); /* settled by attnd_config_from_args */
    ck_assert(c.max_model_bytes == 0);
    ck_assert_int_eq(c.n_models, 0);
    ck_assert(c.config_path == NULL);
    attnd_config_free(&c);
    attnd_config_free(&c); /* a freed config frees again safely */
}
END_TEST

START_TEST(no_config_gives_default_model) {
    char err[512];
    char *argv[] = {"attnd", NULL};
    attnd_config c;
    ck_assert_msg(from_args(&c, 1, argv, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.n_models, 1);
    ck_assert_str_eq(c.models[0].name, "default");
    ck_assert(c.models[0].weights == NULL);
    ck_assert_int_eq(c.models[0].hp.embed_dim, 512);
    ck_assert_int_eq(c.models[0].hp.num_heads, 8);
    ck_assert_int_eq(c.models[0].hp.kdim, 512);
    ck_assert_int_eq(c.models[0].hp.vdim, 512);
    ck_assert_int_eq(c.models[0].hp.bias, 1);
    ck_assert_int_eq(c.models[0].hp.causal, 0);
    ck_assert(c.config_path == NULL);
    attnd_config_free(&c);
}
END_TEST

START_TEST(help_flag) {
    char err[512];
    char *argv[] = {"attnd", "--port", "1", "-h", NULL};
    attnd_config c;
    int help = 0;
    ck_assert(attnd_config_from_args(&c, 4, argv, &help, err, sizeof err) == 0);
    ck_assert_int_eq(help, 1);
    attnd_config_free(&c);
    char *argv2[] = {"attnd", "--help", NULL};
    ck_assert(attnd_config_from_args(&c, 2, argv2, &help, err, sizeof err) == 0);
    ck_assert_int_eq(help, 1);
    attnd_config_free(&c);
}
END_TEST

/* --help lists every flag and every environment variable. */
START_TEST(usage_lists_everything) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert(f != NULL);
    attnd_config_usage(f, "attnd");
    fclose(f);
    const char *want[] = {
        "--config",
        "--host",
        "--port",
        "--workers",
        "--http-threads",
        "--blas-threads",
        "--api-key-env",
        "--max-batch-requests",
        "--max-batch-tokens",
        "--max-queue-delay-us",
        "--model-control",
        "--model-dir",
        "--help",
        "ATTND_CONFIG",
        "ATTND_HOST",
        "ATTND_PORT",
        "ATTND_WORKERS",
        "ATTND_HTTP_THREADS",
        "ATTND_BLAS_THREADS",
        "ATTND_MAX_BATCH_REQUESTS",
        "ATTND_MAX_BATCH_TOKENS",
        "ATTND_MAX_QUEUE_DELAY_US",
        "ATTND_MAX_QUEUE_REQUESTS",
        "ATTND_MAX_BODY_BYTES",
        "ATTND_REQUEST_TIMEOUT_MS",
        "ATTND_MAX_CONNECTIONS",
        "ATTND_CONNECTION_TIMEOUT_S",
        "ATTND_CORS_ORIGINS",
        "ATTND_MAX_TOKENS_PER_REQUEST",
        "ATTND_MAX_ATTENTION_FLOATS",
        "ATTND_BF16_KERNELS",
        "ATTND_MODEL_CONTROL",
        "ATTND_MODEL_DIR",
        "ATTND_MAX_MODEL_BYTES",
        "explicit",
        "the config file's folder",
        "ATTND_API_KEY",
        "default",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(text, want[i]) != NULL, "--help lacks %s", want[i]);
    free(text);
}
END_TEST

/* ------------------------------------------------------------ the file */

START_TEST(every_key_lands) {
    char err[512];
    write_cfg(
        "{\"server\":{\"host\":\"127.0.0.1\",\"port\":0,\"http_threads\":3,"
        "\"max_body_bytes\":1000,\"request_timeout_ms\":5,\"max_connections\":7,"
        "\"connection_timeout_s\":0,\"api_key_env\":\"MY_KEY\","
        "\"cors_origins\":[\"http://a\",\"https://b.example\"],"
        "\"model_control\":\"explicit\",\"model_dir\":\".\"},"
        "\"batching\":{\"max_batch_tokens\":11,\"max_batch_requests\":1,"
        "\"max_queue_delay_us\":0,\"max_queue_requests\":13},"
        "\"workers\":{\"threads\":4,\"blas_threads\":3,\"bf16_kernels\":\"avx512-bf16\","
        "\"int8_kernels\":\"avx-vnni\"},"
        "\"limits\":{\"max_tokens_per_request\":17,\"max_attention_floats\":4294967296,"
        "\"max_sessions\":5,\"max_session_bytes\":9000,\"max_session_bytes_each\":3000,"
        "\"session_idle_s\":2,\"max_model_bytes\":1048576},"
        "\"models\":[{\"name\":\"enc.0\",\"embed_dim\":12,\"num_heads\":3,\"kdim\":8,"
        "\"vdim\":10,\"bias\":false,\"causal\":true,\"weights\":\"w.safetensors\","
        "\"prefix\":\"encoder.layers.3.self_attn.\",\"layout\":\"hf_proj\","
        "\"tensors\":{\"out_weight\":\"o.w\",\"q_bias\":\"q.b\"},\"precision\":\"bf16\"}," MODEL(
            "second", 8, 8) "]}");
    attnd_config c;
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_file(&c, g_cfg, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.host, "127.0.0.1");
    ck_assert_int_eq(c.port, 0);
    ck_assert_int_eq(c.http_threads, 3);
    ck_assert(c.max_body_bytes == 1000);
    ck_assert_int_eq(c.request_timeout_ms, 5);
    ck_assert_int_eq(c.max_connections, 7);
    ck_assert_int_eq(c.connection_timeout_s, 0);
    ck_assert_str_eq(c.api_key_env, "MY_KEY");
    ck_assert_int_eq(c.n_cors_origins, 2);
    ck_assert_str_eq(c.cors_origins[1], "https://b.example");
    ck_assert_int_eq(c.max_batch_tokens, 11);
    ck_assert_int_eq(c.max_batch_requests, 1);
    ck_assert_int_eq(c.max_queue_delay_us, 0);
    ck_assert_int_eq(c.max_queue_requests, 13);
    ck_assert_int_eq(c.worker_threads, 4);
    ck_assert_int_eq(c.blas_threads, 3);
    ck_assert_str_eq(c.bf16_kernels, "avx512-bf16");
    ck_assert_str_eq(c.int8_kernels, "avx-vnni");
    ck_assert_int_eq(c.max_tokens_per_request, 17);
    ck_assert(c.max_attention_floats == 4294967296LL);
    ck_assert_int_eq(c.max_sessions, 5);
    ck_assert(c.max_session_bytes == 9000 && c.max_session_bytes_each == 3000);
    ck_assert_int_eq(c.session_idle_s, 2);
    ck_assert_str_eq(c.model_control, "explicit");
    ck_assert(c.max_model_bytes == 1048576);
    ck_assert(c.model_dir && strstr(c.model_dir, "/sub/.")); /* from the config's folder */
    ck_assert_str_eq(c.config_path, g_cfg);
    ck_assert_int_eq(c.n_models, 2);
    attnd_model_config *m = &c.models[0];
    ck_assert_str_eq(m->name, "enc.0");
    ck_assert_int_eq(m->hp.embed_dim, 12);
    ck_assert_int_eq(m->hp.num_heads, 3);
    ck_assert_int_eq(m->hp.kdim, 8);
    ck_assert_int_eq(m->hp.vdim, 10);
    ck_assert_int_eq(m->hp.bias, 0);
    ck_assert_int_eq(m->hp.causal, 1);
    ck_assert_str_eq(m->weights, g_weights); /* resolved against the config's folder */
    ck_assert_str_eq(m->prefix, "encoder.layers.3.self_attn.");
    ck_assert_str_eq(m->layout, "hf_proj");
    ck_assert_str_eq(m->tensors[ROLE_OUT_WEIGHT], "o.w");
    ck_assert_str_eq(m->tensors[ROLE_Q_BIAS], "q.b");
    ck_assert(m->tensors[ROLE_K_WEIGHT] == NULL);
    ck_assert_int_eq(m->hp.precision, ATTN_BF16);
    m = &c.models[1];
    ck_assert_str_eq(m->name, "second");
    ck_assert_int_eq(m->hp.precision, ATTN_FP32); /* the default */
    ck_assert_int_eq(m->hp.kdim, 8);              /* kdim and vdim default to embed_dim */
    ck_assert_int_eq(m->hp.vdim, 8);
    ck_assert_int_eq(m->hp.bias, 1);
    ck_assert_int_eq(m->hp.causal, 0);
    ck_assert_str_eq(m->prefix, "");
    ck_assert_str_eq(m->layout, "torch");
    attnd_config_free(&c);
}
END_TEST

START_TEST(absolute_weights_path_kept) {
    char err[512], text[1200];
    snprintf(text, sizeof text,
             "{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,\"weights\":\"%s\"}]}",
             g_weights);
    write_cfg(text);
    attnd_config c;
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_file(&c, g_cfg, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.models[0].weights, g_weights);
    attnd_config_free(&c);
}
END_TEST

START_TEST(empty_models_give_default) {
    char err[512];
    write_cfg("{\"server\":{\"port\":9000},\"models\":[]}");
    char *argv[] = {"attnd", "--config", g_cfg, NULL};
    attnd_config c;
    ck_assert_msg(from_args(&c, 3, argv, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.port, 9000);
    ck_assert_int_eq(c.n_models, 1);
    ck_assert_str_eq(c.models[0].name, "default");
    ck_assert(c.models[0].weights == NULL);
    attnd_config_free(&c);
}
END_TEST

/* ------------------------------------------------------------ precedence */

START_TEST(precedence) {
    char err[512];
    write_cfg("{\"server\":{\"port\":1000,\"host\":\"10.0.0.1\",\"http_threads\":5},"
              "\"workers\":{\"threads\":3},\"models\":[" MODEL("m", 4, 2) "]}");
    attnd_config c;
    char *plain[] = {"attnd", "--config", g_cfg, NULL};
    ck_assert_msg(from_args(&c, 3, plain, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.port, 1000); /* file over default */
    ck_assert_int_eq(c.worker_threads, 3);
    attnd_config_free(&c);

    setenv("ATTND_PORT", "2000", 1);
    setenv("ATTND_WORKERS", "6", 1);
    setenv("ATTND_HOST", "", 1); /* empty = unset */
    ck_assert_msg(from_args(&c, 3, plain, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.port, 2000); /* env over file */
    ck_assert_int_eq(c.worker_threads, 6);
    ck_assert_str_eq(c.host, "10.0.0.1");
    ck_assert_int_eq(c.http_threads, 5);
    attnd_config_free(&c);

    char *flags[] = {"attnd", "--port=3000", "--config", g_cfg, "--workers",
                     "7",     "--host",      "::1",      NULL};
    ck_assert_msg(from_args(&c, 8, flags, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.port, 3000); /* flag over env */
    ck_assert_int_eq(c.worker_threads, 7);
    ck_assert_str_eq(c.host, "::1");
    ck_assert_str_eq(c.models[0].name, "m");
    attnd_config_free(&c);
}
END_TEST

START_TEST(config_from_env) {
    char err[512];
    write_cfg("{\"models\":[" MODEL("from_env", 4, 2) "]}");
    setenv("ATTND_CONFIG", g_cfg, 1);
    char *argv[] = {"attnd", NULL};
    attnd_config c;
    ck_assert_msg(from_args(&c, 1, argv, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.models[0].name, "from_env");
    attnd_config_free(&c);
    /* --config wins over ATTND_CONFIG */
    setenv("ATTND_CONFIG", "/nonexistent/c.json", 1);
    char *argv2[] = {"attnd", "--config", g_cfg, NULL};
    ck_assert_msg(from_args(&c, 3, argv2, err, sizeof err) == 0, "%s", err);
    attnd_config_free(&c);
    ck_assert(from_args(&c, 1, argv, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "/nonexistent/c.json") && strstr(err, "cannot open"), "%s", err);
    attnd_config_free(&c);
}
END_TEST

START_TEST(env_values) {
    char err[512];
    char *argv[] = {"attnd", NULL};
    attnd_config c;
    setenv("ATTND_CORS_ORIGINS", "http://a , https://b", 1);
    setenv("ATTND_BLAS_THREADS", "4", 1);
    setenv("ATTND_MAX_BATCH_REQUESTS", "1", 1);
    setenv("ATTND_HTTP_THREADS", "3", 1);
    setenv("ATTND_BF16_KERNELS", "none", 1);
    setenv("ATTND_INT8_KERNELS", "none", 1);
    ck_assert_msg(from_args(&c, 1, argv, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.bf16_kernels, "none");
    ck_assert_str_eq(c.int8_kernels, "none");
    ck_assert_int_eq(c.n_cors_origins, 2);
    ck_assert_str_eq(c.cors_origins[0], "http://a");
    ck_assert_str_eq(c.cors_origins[1], "https://b");
    ck_assert_int_eq(c.blas_threads, 4);
    ck_assert_int_eq(c.max_batch_requests, 1);
    ck_assert_int_eq(c.http_threads, 3);
    attnd_config_free(&c);

    setenv("ATTND_CORS_ORIGINS", "http://a,,http://c", 1);
    ck_assert(from_args(&c, 1, argv, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "ATTND_CORS_ORIGINS") && strstr(err, "server.cors_origins[1]"), "%s",
                  err);
    unsetenv("ATTND_CORS_ORIGINS");
    setenv("ATTND_BF16_KERNELS", "fast", 1);
    ck_assert(from_args(&c, 1, argv, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "ATTND_BF16_KERNELS") && strstr(err, "workers.bf16_kernels") &&
                      strstr(err, "\"avx512-bf16\""),
                  "%s", err);
    unsetenv("ATTND_BF16_KERNELS");
    unsetenv("ATTND_INT8_KERNELS");
    setenv("ATTND_PORT", "80x", 1);
    ck_assert(from_args(&c, 1, argv, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "ATTND_PORT") && strstr(err, "server.port") &&
                      strstr(err, "not an integer"),
                  "%s", err);
    setenv("ATTND_PORT", "70000", 1);
    ck_assert(from_args(&c, 1, argv, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "ATTND_PORT") && strstr(err, "out of range"), "%s", err);
    unsetenv("ATTND_PORT");
    setenv("ATTND_WORKERS", "-1", 1);
    ck_assert(from_args(&c, 1, argv, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "ATTND_WORKERS") && strstr(err, "workers.threads"), "%s", err);
    attnd_config_free(&c); /* already freed by the failed call: a no-op */
}
END_TEST

START_TEST(bad_flags) {
    char err[512];
    attnd_config c;
    char *a1[] = {"attnd", "--prot", "1", NULL};
    ck_assert(from_args(&c, 3, a1, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "unknown flag \"--prot\""), "%s", err);
    char *a2[] = {"attnd", "--port", NULL};
    ck_assert(from_args(&c, 2, a2, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "--port") && strstr(err, "needs a value"), "%s", err);
    char *a3[] = {"attnd", "--workers", "many", NULL};
    ck_assert(from_args(&c, 3, a3, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "--workers") && strstr(err, "not an integer"), "%s", err);
    char *a4[] = {"attnd", "serve", NULL};
    ck_assert(from_args(&c, 2, a4, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "unexpected argument \"serve\""), "%s", err);
    char *a5[] = {"attnd", "--http-threads=-3", NULL};
    ck_assert(from_args(&c, 2, a5, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "server.http_threads") && strstr(err, "out of range"), "%s", err);
    char *a6[] = {"attnd", "--api-key-env", "BAD-NAME", NULL};
    ck_assert(from_args(&c, 3, a6, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "not an environment variable name"), "%s", err);
    attnd_config_free(&c);
}
END_TEST

/* The log settings read before the config: the last flag, else the
 * variable, else text and info; a value the key refuses counts as absent. */
START_TEST(log_settings_early) {
    const char *f, *l;
    char *a0[] = {"attnd", NULL};
    attnd_config_log_early(1, a0, &f, &l);
    ck_assert_str_eq(f, "text");
    ck_assert_str_eq(l, "info");
    setenv("ATTND_LOG_FORMAT", "json", 1);
    setenv("ATTND_LOG_LEVEL", "warn", 1);
    attnd_config_log_early(1, a0, &f, &l);
    ck_assert_str_eq(f, "json");
    ck_assert_str_eq(l, "warn");
    char *a1[] = {"attnd", "--log-format", "text", "--port", "1", "--log-level=error", NULL};
    attnd_config_log_early(6, a1, &f, &l);
    ck_assert_str_eq(f, "text");
    ck_assert_str_eq(l, "error");
    char *a2[] = {"attnd", "--log-format=text", "--log-format", "json", NULL};
    unsetenv("ATTND_LOG_FORMAT");
    attnd_config_log_early(4, a2, &f, &l);
    ck_assert_str_eq(f, "json");
    char *a3[] = {"attnd", "--log-format", "yaml", "--log-level", NULL};
    unsetenv("ATTND_LOG_LEVEL");
    attnd_config_log_early(4, a3, &f, &l);
    ck_assert_str_eq(f, "text");
    ck_assert_str_eq(l, "info");
}
END_TEST

/* ------------------------------------------------------------ refused configs */

START_TEST(refuse_wrong_type) {
    expect_refused("{\"server\":{\"port\":\"8080\"}}", "server.port", "must be an integer");
    expect_refused("{\"server\":{\"port\":80.5}}", "server.port", "must be an integer");
    expect_refused("{\"server\":{\"port\":8.0805e3}}", "server.port", "must be an integer");
    /* a whole number written with a fraction or an exponent is that integer */
    char err[512];
    attnd_config c;
    write_cfg("{\"server\":{\"port\":8081.0,\"max_body_bytes\":1e+06},"
              "\"models\":[{\"name\":\"a\",\"embed_dim\":4.0,\"num_heads\":2,"
              "\"weights\":\"w.safetensors\"}]}");
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_file(&c, g_cfg, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.port, 8081);
    ck_assert_int_eq((int)c.max_body_bytes, 1000000);
    ck_assert_int_eq(c.models[0].hp.embed_dim, 4);
    attnd_config_free(&c);
    expect_refused("{\"server\":{\"host\":1}}", "server.host", "must be a string");
    expect_refused("{\"server\":{\"cors_origins\":\"*\"}}", "server.cors_origins",
                   "must be an array of strings");
    expect_refused("{\"server\":{\"cors_origins\":[\"a\",2]}}", "server.cors_origins[1]",
                   "must be a string");
    expect_refused("{\"server\":[]}", "server", "must be an object");
    expect_refused("{\"models\":{}}", "models", "must be an array");
    expect_refused("{\"models\":[3]}", "models[0]", "must be an object");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\",\"bias\":1}]}",
                   "models[0].bias", "must be true or false");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\",\"tensors\":{\"q_weight\":5}}]}",
                   "models[0].tensors.q_weight", "must be a string");
    expect_refused("[1]", NULL, "top level must be an object");
}
END_TEST

START_TEST(refuse_out_of_range) {
    expect_refused("{\"server\":{\"port\":65536}}", "server.port", "out of range [0, 65535]");
    expect_refused("{\"server\":{\"port\":-1}}", "server.port", "out of range");
    expect_refused("{\"workers\":{\"threads\":-1}}", "workers.threads", "out of range");
    expect_refused("{\"workers\":{\"threads\":1025}}", "workers.threads", "out of range");
    expect_refused("{\"workers\":{\"blas_threads\":0}}", "workers.blas_threads", "out of range");
    expect_refused("{\"batching\":{\"max_batch_requests\":0}}", "batching.max_batch_requests",
                   "out of range");
    expect_refused("{\"limits\":{\"max_attention_floats\":0}}", "limits.max_attention_floats",
                   "out of range");
    expect_refused("{\"server\":{\"host\":\"\"}}", "server.host", "length 0 is out of range");
    expect_refused("{\"models\":[" MODEL("a", 0, 1) "]}", "models[0].embed_dim", "out of range");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,\"kdim\":0,"
                   "\"weights\":\"w.safetensors\"}]}",
                   "models[0].kdim", "out of range");
    expect_refused("{\"models\":[" MODEL("a b", 4, 2) "]}", "models[0].name",
                   "may hold only letters");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\",\"layout\":\"gpt2\"}]}",
                   "models[0].layout", "must be \"torch\", \"bert\", \"hf_proj\" or \"llama\"");
    /* an unknown precision names the model and the words allowed */
    expect_refused("{\"models\":[{\"name\":\"enc\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\",\"precision\":\"fp16\"}]}",
                   "models[0].precision", "must be \"fp32\", \"bf16\" or \"int8\" (model \"enc\")");
    expect_refused("{\"models\":[{\"precision\":\"BF16\",\"name\":\"dec\",\"embed_dim\":4,"
                   "\"num_heads\":2,\"weights\":\"w.safetensors\"}]}",
                   "\"BF16\" must be \"fp32\", \"bf16\" or \"int8\"", "(model \"dec\")");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\",\"precision\":16}]}",
                   "models[0].precision", "must be a string");
    expect_refused("{\"workers\":{\"bf16_kernels\":\"amx\"}}", "workers.bf16_kernels",
                   "must be \"auto\", \"amx-bf16\", \"avx512-bf16\" or \"none\"");
}
END_TEST

/* Every rule on a string's content, each refusal with its reason; an empty
 * api_key_env (no key) is not a bad variable name. */
START_TEST(refuse_string_rules) {
    expect_refused("{\"server\":{\"log_format\":\"xml\"}}", "server.log_format",
                   "\"xml\" must be \"text\" or \"json\"");
    expect_refused("{\"server\":{\"log_level\":\"trace\"}}", "server.log_level",
                   "\"trace\" must be \"debug\", \"info\", \"warn\" or \"error\"");
    expect_refused("{\"server\":{\"api_key_env\":\"1KEY\"}}", "server.api_key_env",
                   "\"1KEY\" is not an environment variable name");
    expect_refused("{\"server\":{\"api_key_env\":\"MY-KEY\"}}", "server.api_key_env",
                   "\"MY-KEY\" is not an environment variable name");
    expect_refused("{\"models\":[" MODEL("a/b", 4, 2) "]}", "models[0].name",
                   "\"a/b\" may hold only letters, digits, '.', '_' and '-'");
    char err[512];
    attnd_config c;
    write_cfg("{\"server\":{\"api_key_env\":\"\",\"log_format\":\"json\","
              "\"log_level\":\"debug\"},\"models\":[" MODEL("a.b_c-1", 4, 2) "]}");
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_file(&c, g_cfg, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.api_key_env, "");
    ck_assert_str_eq(c.log_format, "json");
    ck_assert_str_eq(c.log_level, "debug");
    ck_assert_str_eq(c.models[0].name, "a.b_c-1");
    attnd_config_free(&c);
    setenv("ATTND_LOG_LEVEL", "loud", 1);
    char *a0[] = {"attnd", NULL};
    int help = 0;
    ck_assert(attnd_config_from_args(&c, 1, a0, &help, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "environment variable ATTND_LOG_LEVEL: server.log_level: \"loud\" "
                              "must be \"debug\""),
                  "%s", err);
}
END_TEST

START_TEST(refuse_unknown_key) {
    expect_refused("{\"server\":{\"prot\":1}}", "server.prot", "unknown key");
    expect_refused("{\"sever\":{}}", "sever", "unknown key");
    expect_refused("{\"workers\":{\"worker_threads\":2}}", "workers.worker_threads", "unknown key");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\",\"dropout\":0.1}]}",
                   "models[0].dropout", "unknown key");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\",\"tensors\":{\"query\":\"q\"}}]}",
                   "models[0].tensors.query", "unknown role");
}
END_TEST

START_TEST(refuse_heads_not_dividing) {
    expect_refused("{\"models\":[" MODEL("a", 4, 2) "," MODEL("b", 512, 7) "]}",
                   "models[1].num_heads", "7 does not divide embed_dim 512");
    expect_refused("{\"models\":[" MODEL("a", 4, 8) "]}", "models[0].num_heads", "does not divide");
}
END_TEST

/* ------------------------------------------------------------ decoder options */

/* A llama-layout model with the given extra keys (JSON text after a comma). */
#define LLAMA(extra)                                                                               \
    "{\"models\":[{\"name\":\"d\",\"embed_dim\":64,\"num_heads\":8,\"layout\":\"llama\","          \
    "\"weights\":\"w.safetensors\"" extra "}]}"

static attnd_model_config load_one(const char *text, attnd_config *c) {
    char err[512];
    write_cfg(text);
    ck_assert(attnd_config_defaults(c) == 0);
    ck_assert_msg(attnd_config_load_file(c, g_cfg, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c->n_models, 1);
    return c->models[0];
}

START_TEST(decoder_keys_land) {
    attnd_config c;
    attnd_model_config m =
        load_one(LLAMA(",\"num_kv_heads\":2,\"head_dim\":16,\"scale\":0.125,\"max_positions\":4096,"
                       "\"rope\":{\"theta\":500000,\"dim\":12,\"style\":\"interleaved\","
                       "\"scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
                       "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}}"),
                 &c);
    ck_assert_int_eq(m.hp.num_kv_heads, 2);
    ck_assert_int_eq(m.hp.head_dim, 16);
    ck_assert(m.hp.scale == 0.125);
    ck_assert_int_eq(m.max_positions, 4096);
    ck_assert_int_eq(m.hp.rope.dim, 12);
    ck_assert(m.hp.rope.theta == 500000);
    ck_assert_int_eq(m.hp.rope.style, ATTN_ROPE_INTERLEAVED);
    ck_assert_int_eq(m.hp.rope.scaling, ATTN_ROPE_SCALE_LLAMA3);
    ck_assert(m.hp.rope.factor == 8 && m.hp.rope.low_freq_factor == 1 &&
              m.hp.rope.high_freq_factor == 4);
    ck_assert_int_eq(m.hp.rope.original_max_position, 8192);
    /* llama defaults: no biases, causal */
    ck_assert_int_eq(m.hp.bias, 0);
    ck_assert_int_eq(m.hp.causal, 1);
    attnd_config_free(&c);

    /* rope defaults: theta 10000, dim = head width, half, no scaling */
    m = load_one(LLAMA(",\"rope\":{},\"bias\":true,\"causal\":false"), &c);
    ck_assert(m.hp.rope.theta == 10000);
    ck_assert_int_eq(m.hp.rope.dim, 8);
    ck_assert_int_eq(m.hp.rope.style, ATTN_ROPE_HALF);
    ck_assert_int_eq(m.hp.rope.scaling, ATTN_ROPE_SCALE_NONE);
    ck_assert_int_eq(m.hp.bias, 1);
    ck_assert_int_eq(m.hp.causal, 0);
    ck_assert_int_eq(m.hp.num_kv_heads, 0); /* 0: num_heads, filled by attn_model_init */
    attnd_config_free(&c);

    m = load_one(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\",\"factor\":2.5}}"), &c);
    ck_assert_int_eq(m.hp.rope.scaling, ATTN_ROPE_SCALE_LINEAR);
    ck_assert(m.hp.rope.factor == 2.5);
    attnd_config_free(&c);

    /* YaRN as DeepSeek and gpt-oss give it (a context written 4096.0), and
     * as Qwen2.5 does: the numbers it leaves out stay 0, the defaults */
    m = load_one(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":40,"
                       "\"original_max_position_embeddings\":4096.0,\"beta_fast\":16,"
                       "\"beta_slow\":2,\"mscale\":1,\"mscale_all_dim\":0.5,"
                       "\"attention_factor\":1.25,\"truncate\":false}}"),
                 &c);
    ck_assert_int_eq(m.hp.rope.scaling, ATTN_ROPE_SCALE_YARN);
    ck_assert(m.hp.rope.factor == 40 && m.hp.rope.beta_fast == 16 && m.hp.rope.beta_slow == 2);
    ck_assert(m.hp.rope.mscale == 1 && m.hp.rope.mscale_all_dim == 0.5);
    ck_assert(m.hp.rope.attention_factor == 1.25 && m.hp.rope.exact_range == 1);
    ck_assert_int_eq(m.hp.rope.original_max_position, 4096);
    attnd_config_free(&c);
    /* Qwen2.5's, with both names; and Hugging Face reads 0 betas and mscales
     * as left out, and a dict saved from Python may hold None */
    const char *plain[] = {
        LLAMA(",\"rope\":{\"scaling\":{\"rope_type\":\"yarn\",\"type\":\"yarn\","
              "\"factor\":4,\"original_max_position_embeddings\":32768}}"),
        LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":4,"
              "\"original_max_position_embeddings\":64,\"beta_fast\":0,\"mscale\":0,"
              "\"mscale_all_dim\":0,\"attention_factor\":null,\"truncate\":null}}")};
    for (int i = 0; i < 2; i++) {
        m = load_one(plain[i], &c);
        ck_assert_int_eq(m.hp.rope.scaling, ATTN_ROPE_SCALE_YARN);
        ck_assert(m.hp.rope.beta_fast == 0 && m.hp.rope.mscale == 0 &&
                  m.hp.rope.attention_factor == 0 && m.hp.rope.exact_range == 0);
        attnd_config_free(&c);
    }

    /* Hugging Face's rope_scaling often holds both names, equal: one type */
    m = load_one(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"llama3\",\"rope_type\":\"llama3\","
                       "\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                       "\"original_max_position_embeddings\":8192}}"),
                 &c);
    ck_assert_int_eq(m.hp.rope.scaling, ATTN_ROPE_SCALE_LLAMA3);
    ck_assert(m.hp.rope.factor == 8);
    attnd_config_free(&c);

    /* Hugging Face's "no scaling": null, or the type "default" by either name */
    const char *none[] = {"null", "{\"rope_type\":\"default\"}", "{\"type\":\"default\"}",
                          "{\"type\":\"default\",\"rope_type\":\"default\"}"};
    for (int i = 0; i < (int)(sizeof none / sizeof none[0]); i++) {
        char text[512];
        snprintf(text, sizeof text, LLAMA(",\"rope\":{\"theta\":500000,\"scaling\":%s}"), none[i]);
        m = load_one(text, &c);
        ck_assert_msg(m.hp.rope.scaling == ATTN_ROPE_SCALE_NONE, "%s", none[i]);
        ck_assert_int_eq(m.hp.rope.dim, 8);
        ck_assert(m.hp.rope.theta == 500000);
        attnd_config_free(&c);
    }
    /* "rope": null is no rope, as if left out */
    m = load_one(LLAMA(",\"rope\":null"), &c);
    ck_assert_int_eq(m.hp.rope.dim, 0);
    attnd_config_free(&c);

    /* other layouts keep torch's defaults */
    m = load_one("{\"models\":[" MODEL("t", 8, 2) "]}", &c);
    ck_assert_int_eq(m.hp.bias, 1);
    ck_assert_int_eq(m.hp.causal, 0);
    attnd_config_free(&c);
}
END_TEST

START_TEST(decoder_combinations_refused) {
    expect_refused(LLAMA(",\"num_kv_heads\":3"), "models[0].num_kv_heads",
                   "3 does not divide num_heads 8");
    expect_refused(LLAMA(",\"num_kv_heads\":0"), "models[0].num_kv_heads", "out of range");
    expect_refused(LLAMA(",\"rope\":{\"dim\":7}"), "models[0].rope.dim", "7 is odd");
    /* left out, rope.dim is the head width, which may be odd */
    expect_refused(LLAMA(",\"head_dim\":7,\"rope\":{}"), "models[0].rope.dim", "7 is odd");
    expect_refused("{\"models\":[{\"name\":\"d\",\"embed_dim\":56,\"num_heads\":8,"
                   "\"layout\":\"llama\",\"weights\":\"w.safetensors\",\"rope\":{}}]}",
                   "models[0].rope.dim", "give an even rope.dim");
    expect_refused(LLAMA(",\"rope\":{\"dim\":10}"), "models[0].rope.dim",
                   "wider than a head (8 columns)");
    expect_refused(LLAMA(",\"head_dim\":4,\"rope\":{\"dim\":6}"), "models[0].rope.dim",
                   "wider than a head (4 columns)");
    expect_refused(LLAMA(",\"rope\":{\"theta\":0}"), "models[0].rope.theta", "out of range");
    expect_refused(LLAMA(",\"rope\":{\"theta\":\"big\"}"), "models[0].rope.theta",
                   "must be a number");
    expect_refused(LLAMA(",\"rope\":{\"style\":\"neox\"}"), "models[0].rope.style",
                   "\"half\" or \"interleaved\"");
    expect_refused(LLAMA(",\"rope\":{\"thetta\":1}"), "models[0].rope.thetta",
                   "did you mean \"theta\"");
    expect_refused(LLAMA(",\"rope\":[]"), "models[0].rope", "must be an object");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":2}}"),
                   "models[0].rope.scaling.original_max_position_embeddings",
                   "missing; yarn scaling needs it");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":2,"
                         "\"original_max_position_embeddings\":64,\"truncate\":0}}"),
                   "models[0].rope.scaling.truncate", "must be true or false");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":2,"
                         "\"original_max_position_embeddings\":64,\"mscale\":-1}}"),
                   "models[0].rope.scaling.mscale", "out of range [0, 1e+06]");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":2,"
                         "\"original_max_position_embeddings\":64,\"attention_factor\":0}}"),
                   "models[0].rope.scaling.attention_factor", "out of range (0,");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":2,"
                         "\"original_max_position_embeddings\":null}}"),
                   "models[0].rope.scaling.original_max_position_embeddings", "missing");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"yarn\",\"factor\":2,"
                         "\"original_max_position_embeddings\":64,\"low_freq_factor\":1}}"),
                   "models[0].rope.scaling.low_freq_factor", "only llama3 scaling takes it");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\",\"factor\":2,"
                         "\"beta_fast\":32}}"),
                   "models[0].rope.scaling.beta_fast", "only yarn scaling takes it");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\",\"factor\":2,"
                         "\"original_max_position_embeddings\":64}}"),
                   "models[0].rope.scaling.original_max_position_embeddings",
                   "only llama3 and yarn scaling take it");
    expect_refused(LLAMA(",\"rope\":{\"theta\":1,\"scaling\":{\"type\":\"yarn\","
                         "\"factor\":2,\"original_max_position_embeddings\":64}}"),
                   "models[0]", "theta other than 1");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"longrope\",\"factor\":2}}"),
                   "models[0].rope.scaling.type", "which the keys already in a KV cache");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\"}}"),
                   "models[0].rope.scaling.factor", "missing");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\",\"factor\":2,"
                         "\"low_freq_factor\":1}}"),
                   "models[0].rope.scaling.low_freq_factor", "only llama3");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"llama3\",\"factor\":8,"
                         "\"low_freq_factor\":4,\"high_freq_factor\":1,"
                         "\"original_max_position_embeddings\":8192}}"),
                   "models[0].rope.scaling.high_freq_factor", "greater than low_freq_factor");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"llama3\",\"factor\":8,"
                         "\"low_freq_factor\":1,\"high_freq_factor\":4}}"),
                   "models[0].rope.scaling.original_max_position_embeddings", "missing");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\",\"rope_type\":\"llama3\","
                         "\"factor\":2}}"),
                   "models[0].rope.scaling", "\"type\" and \"rope_type\" differ");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\",\"rope_type\":7,"
                         "\"factor\":2}}"),
                   "models[0].rope.scaling", "\"type\" and \"rope_type\" differ");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"rope_type\":\"ntk\",\"factor\":2}}"),
                   "models[0].rope.scaling.rope_type",
                   "\"ntk\" is not \"linear\", \"llama3\" or \"yarn\" (model");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"dynamic\",\"factor\":2}}"),
                   "models[0].rope.scaling.type",
                   "not \"linear\", \"llama3\" or \"yarn\"; its frequencies change with the "
                   "length of each sequence");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"rope_type\":\"default\",\"factor\":2}}"),
                   "models[0].rope.scaling.factor", "no scaling and takes no numbers");
    expect_refused(LLAMA(",\"rope\":null,\"max_positions\":100"), "models[0].max_positions",
                   "only a model with rope");
    expect_refused(LLAMA(",\"rope\":{\"scaling\":{\"type\":\"linear\",\"factr\":2}}"),
                   "models[0].rope.scaling.factr", "did you mean \"factor\"");
    expect_refused(LLAMA(",\"scale\":0"), "models[0].scale", "out of range");
    expect_refused(LLAMA(",\"scale\":-1.5"), "models[0].scale", "out of range");
    expect_refused(LLAMA(",\"scale\":\"x\""), "models[0].scale", "must be a number");
    expect_refused(LLAMA(",\"rope\":{},\"kdim\":32"), "models[0].rope", "need self-attention");
    expect_refused(LLAMA(",\"max_positions\":100"), "models[0].max_positions",
                   "only a model with rope");
    /* nn.MultiheadAttention's packed tensors cannot hold grouped heads */
    expect_refused("{\"models\":[{\"name\":\"t\",\"embed_dim\":8,\"num_heads\":2,"
                   "\"num_kv_heads\":1,\"weights\":\"w.safetensors\"}]}",
                   "models[0].layout", "use \"llama\"");
    /* without head_dim, E must still divide; with it, it need not */
    expect_refused("{\"models\":[{\"name\":\"d\",\"embed_dim\":60,\"num_heads\":8,"
                   "\"layout\":\"llama\",\"weights\":\"w.safetensors\"}]}",
                   "models[0].num_heads", "or give head_dim");
    attnd_config c;
    attnd_model_config m = load_one("{\"models\":[{\"name\":\"d\",\"embed_dim\":60,"
                                    "\"num_heads\":8,\"head_dim\":16,\"layout\":\"llama\","
                                    "\"weights\":\"w.safetensors\"}]}",
                                    &c);
    ck_assert_int_eq(m.hp.head_dim, 16);
    attnd_config_free(&c);
}
END_TEST

START_TEST(refuse_duplicate_names) {
    expect_refused("{\"models\":[" MODEL("a", 4, 2) "," MODEL("b", 4, 2) "," MODEL("a", 8, 2) "]}",
                   "models[2].name", "already the name of models[0]");
}
END_TEST

START_TEST(refuse_missing_weights_file) {
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"nope.safetensors\"}]}",
                   "models[0].weights", "cannot open weights file");
    /* the message shows where it looked: next to the config */
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\"nope.safetensors\"}]}",
                   "sub/nope.safetensors", "No such file");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                   "\"weights\":\".\"}]}",
                   "models[0].weights", "not a regular file");
}
END_TEST

START_TEST(refuse_missing_required) {
    expect_refused("{\"models\":[{\"name\":\"a\",\"num_heads\":2,\"weights\":\"w.safetensors\"}]}",
                   "models[0].embed_dim", "missing");
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2}]}",
                   "models[0].weights", "missing");
    expect_refused("{\"models\":[{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"w.safetensors\"}]}",
                   "models[0].name", "missing");
}
END_TEST

/* A key given as null is the key left out, as a dict saved from Python with
 * None holds it (torch's own kdim=None, vdim=None): the default, in a
 * model and in a section alike; a required one is refused as null. */
START_TEST(null_is_left_out) {
    attnd_config c;
    attnd_model_config m =
        load_one("{\"server\":{\"port\":null,\"host\":null,\"cors_origins\":null},"
                 "\"batching\":{\"max_batch_requests\":null},"
                 "\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
                 "\"weights\":\"w.safetensors\",\"kdim\":null,\"vdim\":null,\"bias\":null,"
                 "\"causal\":null,\"prefix\":null,\"precision\":null,\"layout\":null,"
                 "\"tensors\":null}]}",
                 &c);
    attnd_config d;
    ck_assert(attnd_config_defaults(&d) == 0);
    ck_assert_int_eq(c.port, d.port);
    ck_assert_int_eq(c.max_batch_requests, d.max_batch_requests);
    ck_assert_int_eq(m.hp.kdim, 4);
    ck_assert_int_eq(m.hp.vdim, 4);
    ck_assert_int_eq(m.hp.bias, 1);
    ck_assert_str_eq(m.prefix, "");
    attnd_config_free(&d);
    attnd_config_free(&c);
    expect_refused("{\"models\":[{\"name\":\"a\",\"embed_dim\":null,\"num_heads\":2,"
                   "\"weights\":\"w.safetensors\"}]}",
                   "models[0].embed_dim", "null; every model needs it");
}
END_TEST

START_TEST(refuse_bad_json) {
    expect_refused("{\"server\":{\"port\":8080,}}", NULL, "not valid JSON (line 1");
    expect_refused("{\"server\":{\"port\":1},\"server\":{\"port\":2}}", NULL, "duplicate");
    expect_refused("", NULL, "not valid JSON");
}
END_TEST

START_TEST(missing_config_file) {
    char err[512];
    attnd_config c;
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert(attnd_config_load_file(&c, "/nonexistent/attnd.json", err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "/nonexistent/attnd.json") && strstr(err, "cannot open"), "%s", err);
    attnd_config_free(&c);
}
END_TEST

/* A refused file leaves the config whole (still freeable, old models kept). */
START_TEST(refusal_keeps_config_consistent) {
    char err[512];
    attnd_config c;
    write_cfg("{\"models\":[" MODEL("keep", 4, 2) "]}");
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert(attnd_config_load_file(&c, g_cfg, err, sizeof err) == 0);
    write_cfg("{\"models\":[" MODEL("x", 4, 2) "," MODEL("y", 4, 3) "]}");
    ck_assert(attnd_config_load_file(&c, g_cfg, err, sizeof err) == -1);
    ck_assert_int_eq(c.n_models, 1);
    ck_assert_str_eq(c.models[0].name, "keep");
    attnd_config_free(&c);
}
END_TEST

/* ------------------------------------------------------------ model folder */

/* realpath of path into out (the tests compare resolved folders). */
static void real(const char *path, char *out) {
    char *r = realpath(path, NULL);
    ck_assert_msg(r != NULL, "%s", path);
    snprintf(out, 512, "%s", r);
    free(r);
}

/* server.model_dir when not given: the config file's folder, absolute;
 * the working directory without a config file. */
START_TEST(model_dir_default) {
    char err[512], want[512], sub[300];
    attnd_config c;
    write_cfg("{\"models\":[" MODEL("m", 4, 2) "]}");
    char *argv[] = {"attnd", "--config", g_cfg, NULL};
    ck_assert_msg(from_args(&c, 3, argv, err, sizeof err) == 0, "%s", err);
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    real(sub, want);
    ck_assert_str_eq(c.model_dir, want);
    ck_assert_int_eq(c.explicit_control, 0);
    attnd_config_free(&c);

    char *bare[] = {"attnd", NULL};
    ck_assert_msg(from_args(&c, 1, bare, err, sizeof err) == 0, "%s", err);
    real(".", want);
    ck_assert_str_eq(c.model_dir, want);
    attnd_config_free(&c);

    /* a config file given by a relative name: its folder, made absolute */
    char cwd[512];
    ck_assert(getcwd(cwd, sizeof cwd) != NULL);
    ck_assert(chdir(g_dir) == 0);
    char *rel[] = {"attnd", "--config", "sub/c.json", NULL};
    int rc = from_args(&c, 3, rel, err, sizeof err);
    ck_assert(chdir(cwd) == 0);
    ck_assert_msg(rc == 0, "%s", err);
    real(sub, want);
    ck_assert_str_eq(c.model_dir, want);
    attnd_config_free(&c);
}
END_TEST

/* A value: relative in the file, from the file's folder; from a variable or
 * a flag, from the working directory; symbolic links resolved; the last
 * source wins, as for every key. */
START_TEST(model_dir_given) {
    char err[512], want[512], path[600], link[600];
    attnd_config c;
    snprintf(path, sizeof path, "%s/models", g_dir);
    ck_assert(mkdir(path, 0700) == 0);
    snprintf(link, sizeof link, "%s/sub/to_models", g_dir);
    ck_assert(symlink(path, link) == 0);
    real(path, want);
    write_cfg("{\"server\":{\"model_dir\":\"to_models\"},\"models\":[" MODEL("m", 4, 2) "]}");
    char *argv[] = {"attnd", "--config", g_cfg, NULL};
    ck_assert_msg(from_args(&c, 3, argv, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.model_dir, want); /* the link resolved */
    attnd_config_free(&c);

    char cwd[512];
    ck_assert(getcwd(cwd, sizeof cwd) != NULL);
    ck_assert(chdir(g_dir) == 0);
    setenv("ATTND_MODEL_DIR", "models", 1);
    int rc = from_args(&c, 3, argv, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_str_eq(c.model_dir, want);
    attnd_config_free(&c);
    char *flag[] = {"attnd", "--config", g_cfg, "--model-dir", "sub", NULL};
    rc = from_args(&c, 5, flag, err, sizeof err);
    ck_assert(chdir(cwd) == 0);
    ck_assert_msg(rc == 0, "%s", err);
    snprintf(path, sizeof path, "%s/sub", g_dir); /* the flag's "sub", from the cwd */
    real(path, want);
    ck_assert_str_eq(c.model_dir, want);
    attnd_config_free(&c);
    unlink(link);
    snprintf(path, sizeof path, "%s/models", g_dir);
    rmdir(path);
}
END_TEST

/* A folder that does not exist, or a file, is refused at start (exit 2),
 * naming server.model_dir and where the value came from. */
START_TEST(model_dir_refused) {
    char err[512];
    attnd_config c;
    expect_refused("{\"server\":{\"model_dir\":\"nope\"}}", "server.model_dir",
                   "/sub/nope\" does not exist");
    expect_refused("{\"server\":{\"model_dir\":\"w.safetensors\"}}", "server.model_dir",
                   "is not a folder");
    expect_refused("{\"server\":{\"model_dir\":\"\"}}", "server.model_dir", "length 0");
    expect_refused("{\"server\":{\"model_dir\":7}}", "server.model_dir", "must be a string");
    setenv("ATTND_MODEL_DIR", "/nonexistent/models", 1);
    char *argv[] = {"attnd", NULL};
    ck_assert(from_args(&c, 1, argv, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "environment variable ATTND_MODEL_DIR: server.model_dir: "
                              "\"/nonexistent/models\" does not exist"),
                  "%s", err);
    unsetenv("ATTND_MODEL_DIR");
    char *flag[] = {"attnd", "--model-dir", g_weights, NULL};
    ck_assert(from_args(&c, 3, flag, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "flag --model-dir: server.model_dir") &&
                      strstr(err, "is not a folder"),
                  "%s", err);
    attnd_config_free(&c);
}
END_TEST

/* server.model_control: "none" by default, "explicit" resolved into
 * explicit_control; other words refused with the list. The byte bound
 * lands; a negative one is refused. main()'s arguments are remembered. */
START_TEST(model_control_and_bytes) {
    char err[512];
    attnd_config c;
    char *argv[] = {"attnd", "--model-control", "explicit", NULL};
    ck_assert_msg(from_args(&c, 3, argv, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.model_control, "explicit");
    ck_assert_int_eq(c.explicit_control, 1);
    ck_assert_int_eq(c.argc, 3);
    ck_assert(c.argv == argv);
    attnd_config_free(&c);
    setenv("ATTND_MODEL_CONTROL", "none", 1);
    setenv("ATTND_MAX_MODEL_BYTES", "4096", 1);
    char *bare[] = {"attnd", NULL};
    ck_assert_msg(from_args(&c, 1, bare, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.explicit_control, 0);
    ck_assert(c.max_model_bytes == 4096);
    attnd_config_free(&c);
    setenv("ATTND_MODEL_CONTROL", "poll", 1);
    ck_assert(from_args(&c, 1, bare, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "ATTND_MODEL_CONTROL: server.model_control: \"poll\" must be "
                              "\"none\" or \"explicit\""),
                  "%s", err);
    unsetenv("ATTND_MODEL_CONTROL");
    expect_refused("{\"server\":{\"model_control\":\"Explicit\"}}", "server.model_control",
                   "must be \"none\" or \"explicit\"");
    expect_refused("{\"limits\":{\"max_model_bytes\":-1}}", "limits.max_model_bytes",
                   "out of range");
    expect_refused("{\"server\":{\"max_model_bytes\":1}}", "server.max_model_bytes",
                   "belongs in \"limits\"");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("config");
    TCase *t = tcase_create("config");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, defaults);
    tcase_add_test(t, no_config_gives_default_model);
    tcase_add_test(t, help_flag);
    tcase_add_test(t, usage_lists_everything);
    tcase_add_test(t, every_key_lands);
    tcase_add_test(t, absolute_weights_path_kept);
    tcase_add_test(t, empty_models_give_default);
    tcase_add_test(t, precedence);
    tcase_add_test(t, config_from_env);
    tcase_add_test(t, env_values);
    tcase_add_test(t, bad_flags);
    tcase_add_test(t, log_settings_early);
    tcase_add_test(t, refuse_wrong_type);
    tcase_add_test(t, refuse_out_of_range);
    tcase_add_test(t, refuse_string_rules);
    tcase_add_test(t, refuse_unknown_key);
    tcase_add_test(t, refuse_heads_not_dividing);
    tcase_add_test(t, decoder_keys_land);
    tcase_add_test(t, decoder_combinations_refused);
    tcase_add_test(t, refuse_duplicate_names);
    tcase_add_test(t, refuse_missing_weights_file);
    tcase_add_test(t, refuse_missing_required);
    tcase_add_test(t, null_is_left_out);
    tcase_add_test(t, refuse_bad_json);
    tcase_add_test(t, missing_config_file);
    tcase_add_test(t, refusal_keeps_config_consistent);
    tcase_add_test(t, model_dir_default);
    tcase_add_test(t, model_dir_given);
    tcase_add_test(t, model_dir_refused);
    tcase_add_test(t, model_control_and_bytes);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(suite());
}
