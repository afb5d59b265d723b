/* meta.c - the bodies of the routes that only describe the server (meta.h):
 * JSON trees built with Jansson, then kept as text: GET /v2's once at
 * start-up, the models' on each call (they change as models load). */
#include "meta.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/cpus.h"

static char *dump(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    return t;
}

/* YaRN's scaling as the model computes it: the defaults filled in, and
 * the attention factor that multiplies cos and sin. */
static json_t *yarn_json(const attn_rope *r, const char *type) {
    json_t *j = json_pack("{s:s, s:f, s:i, s:f, s:f}", "type", type, "factor", r->factor,
                          "original_max_position_embeddings", r->original_max_position, "beta_fast",
                          r->beta_fast > 0 ? r->beta_fast : 32, "beta_slow",
                          r->beta_slow > 0 ? r->beta_slow : 1);
    if (r->mscale > 0) json_object_set_new(j, "mscale", json_real(r->mscale));
    if (r->mscale_all_dim > 0)
        json_object_set_new(j, "mscale_all_dim", json_real(r->mscale_all_dim));
    json_object_set_new(j, "attention_factor", json_real(attn_rope_attention_factor(r)));
    json_object_set_new(j, "truncate", json_boolean(!r->exact_range));
    return j;
}

/* A model's rotary positions as its config gives them. */
static json_t *rope_json(const attn_rope *r) {
    json_t *j = json_pack("{s:f, s:i, s:s}", "theta", r->theta, "dim", r->dim, "style",
                          attnd_enum_name(&attnd_rope_styles, r->style));
    const char *type = attnd_enum_name(&attnd_rope_scalings, r->scaling);
    if (r->scaling == ATTN_ROPE_SCALE_LINEAR)
        json_object_set_new(j, "scaling",
                            json_pack("{s:s, s:f}", "type", type, "factor", r->factor));
    if (r->scaling == ATTN_ROPE_SCALE_LLAMA3)
        json_object_set_new(j, "scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "type", type, "factor",
                                      r->factor, "low_freq_factor", r->low_freq_factor,
                                      "high_freq_factor", r->high_freq_factor,
                                      "original_max_position_embeddings",
                                      r->original_max_position));
    if (r->scaling == ATTN_ROPE_SCALE_YARN) json_object_set_new(j, "scaling", yarn_json(r, type));
    return j;
}

/* One tensor of the v2 model metadata: rank dimensions, variable (-1)
 * but the last, which is width when width > 0. */
static json_t *v2_tensor(const char *name, const char *datatype, int rank, int width) {
    json_t *shape = json_array();
    for (int d = 0; d < rank; d++)
        json_array_append_new(shape, json_integer(d == rank - 1 && width > 0 ? width : -1));
    return json_pack("{s:s, s:s, s:o}", "name", name, "datatype", datatype, "shape", shape);
}

/* A model's precision as its config asks (hp.precision), as it computes
 * (info->precision: fp32 on a CPU without bf16 kernels), and what its
 * attention and its sessions' caches hold (bf16 where its head width has
 * the bf16 attention kernels), into j. */
static void precision_json(json_t *j, const attnd_model_info *info) {
    json_object_set_new(j, "precision",
                        json_string(attnd_enum_name(&attnd_precisions, info->hp.precision)));
    json_object_set_new(j, "effective_precision",
                        json_string(attnd_enum_name(&attnd_precisions, info->precision)));
    json_object_set_new(j, "attention_precision", json_string(info->kv16 ? "bf16" : "fp32"));
}

/* GET /v2/models/{name}: the inputs this model accepts and the outputs it
 * gives (docs/api.md): output, attention, and the top-k outputs that
 * parameters.attention_top_k answers in its place. A model with rotary
 * positions takes positions and no key or value (a key row would have no
 * position); the others the reverse. The platform follows the protocol's
 * "<project>_<format>": the weights' format, a safetensors file or the
 * embedded default. Beside the protocol's fields, like /v2's blas_core:
 * precision and effective_precision. */
static json_t *v2_model_json(const attnd_model_info *info) {
    const attn_hparams *hp = &info->hp;
    json_t *in = json_array();
    json_array_append_new(in, v2_tensor("query", "FP32", 3, hp->embed_dim));
    if (!hp->rope.dim) {
        json_array_append_new(in, v2_tensor("key", "FP32", 3, hp->kdim));
        json_array_append_new(in, v2_tensor("value", "FP32", 3, hp->vdim));
    }
    json_array_append_new(in, v2_tensor("key_padding_mask", "BOOL", 2, 0));
    json_array_append_new(in, v2_tensor("attn_mask", "BOOL", 3, 0));
    if (hp->rope.dim) json_array_append_new(in, v2_tensor("positions", "INT64", 2, 0));
    char version[16];
    snprintf(version, sizeof version, "%d", info->version);
    json_t *j = json_pack(
        "{s:s, s:[s], s:s, s:o, s:[o, o, o, o]}", "name", info->name, "versions", version,
        "platform", info->from_file ? "attnd_safetensors" : "attnd_embedded", "inputs", in,
        "outputs", v2_tensor("output", "FP32", 3, hp->embed_dim),
        v2_tensor("attention", "FP32", 4, 0), v2_tensor("attention_topk_indices", "INT32", 4, 0),
        v2_tensor("attention_topk_values", "FP32", 4, 0));
    if (j) precision_json(j, info);
    return j;
}

/* One model of GET /v1/models: its hyper-parameters as loaded. */
static json_t *model_json(const attnd_model_info *info) {
    const attn_hparams *hp = &info->hp; /* filled in by attn_model_init */
    json_t *m =
        json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:b, s:b, s:s}", "name",
                  info->name, "version", info->version, "embed_dim", hp->embed_dim, "num_heads",
                  hp->num_heads, "num_kv_heads", hp->num_kv_heads, "head_dim", hp->head_dim, "kdim",
                  hp->kdim, "vdim", hp->vdim, "scale", hp->scale, "bias", hp->bias, "causal",
                  hp->causal, "weights", info->from_file ? "safetensors" : "embedded");
    if (hp->rope.dim) json_object_set_new(m, "rope", rope_json(&hp->rope));
    if (info->max_positions)
        json_object_set_new(m, "max_positions", json_integer(info->max_positions));
    precision_json(m, info);
    json_object_set_new(m, "weights_bytes", json_integer((json_int_t)info->bytes));
    return m;
}

/* GET /v1/models: the models, the limits, batching, and what computes. */
static json_t *models_json(const attnd_config *c, attnd_version *const *vs, int n) {
    json_t *models = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(models, model_json(&vs[i]->info));
    const attn_blas_info *blas = attn_blas_get_info();
    attnd_cpus cpus;
    attnd_cpus_count(&cpus);
    json_t *root = json_pack(
        "{s:o, s:{s:I, s:I, s:I, s:i}, s:{s:i, s:i, s:i, s:i}, s:{s:i}, s:{s:i, s:i, s:i, s:s, "
        "s:b, "
        "s:s}}",
        "models", models, "limits", "max_body_bytes", (json_int_t)c->max_body_bytes,
        "max_tokens_per_request", (json_int_t)c->max_tokens_per_request, "max_attention_floats",
        (json_int_t)c->max_attention_floats, "request_timeout_ms", c->request_timeout_ms,
        "batching", "max_batch_tokens", c->max_batch_tokens, "max_batch_requests",
        c->max_batch_requests, "max_queue_delay_us", c->max_queue_delay_us, "max_queue_requests",
        c->max_queue_requests, "workers", "threads", c->compute_threads, "compute", "threads",
        c->compute_threads, "cpus", cpus.n, "http_threads", c->http_pollers, "blas_core",
        blas ? blas->core : "none", "blas_core_from_env", blas && blas->by_user, "cpu_features",
        blas ? blas->features : "");
    json_object_set_new(json_object_get(root, "compute"), "pinned", json_boolean(c->pin));
    json_object_set_new(json_object_get(root, "compute"), "bf16_kernels",
                        json_string(attn_bf16_kernels()));
    json_object_set_new(json_object_get(root, "compute"), "int8_kernels",
                        json_string(attn_int8_kernels()));
    json_object_set_new(json_object_get(root, "compute"), "bf16_products",
                        json_string(attn_bf16_products()));
    json_t *lim = json_object_get(root, "limits");
    json_object_set_new(lim, "max_sessions", json_integer(c->max_sessions));
    json_object_set_new(lim, "max_session_bytes", json_integer(c->max_session_bytes));
    json_object_set_new(lim, "max_session_bytes_each", json_integer(c->max_session_bytes_each));
    json_object_set_new(lim, "session_idle_s", json_integer(c->session_idle_s));
    return root;
}

char *attnd_meta_models(const attnd_config *c, attnd_version *const *vs, int n) {
    return dump(models_json(c, vs, n));
}

char *attnd_meta_v2_model(const attnd_model_info *info) {
    return dump(v2_model_json(info));
}

int attnd_meta_build(attnd_meta *m) {
    const attn_blas_info *blas = attn_blas_get_info();
    memset(m, 0, sizeof *m);
    m->v2 =
        dump(json_pack("{s:s, s:s, s:[s, s], s:s, s:s}", "name", "attnd", "version", ATTND_VERSION,
                       "extensions", "binary_tensor_data", "model_repository", "blas_core",
                       blas ? blas->core : "none", "cpu_features", blas ? blas->features : ""));
    return m->v2 ? 0 : -1;
}

void attnd_meta_free(attnd_meta *m) {
    free(m->v2);
    memset(m, 0, sizeof *m);
}
