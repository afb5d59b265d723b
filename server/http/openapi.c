/* openapi.c - GET /openapi.json (openapi.h): server/http/openapi.json,
 * the OpenAPI 3 description of every route, embedded in the binary at
 * build time, fitted to the daemon as it runs each time it is asked for
 * (not a hot path: a few dozen kilobytes of JSON, read and written again
 * with Jansson). */
#include "openapi.h"

#include <float.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__asm__(".section .rodata\n"
        ".global attnd_openapi_json\n"
        ".type attnd_openapi_json, @object\n"
        ".balign 16\n"
        "attnd_openapi_json:\n"
        ".incbin \"server/http/openapi.json\"\n"
        "attnd_openapi_json_end:\n"
        ".byte 0\n"
        ".global attnd_openapi_json_len\n"
        ".type attnd_openapi_json_len, @object\n"
        ".balign 8\n"
        "attnd_openapi_json_len:\n"
        ".quad attnd_openapi_json_end - attnd_openapi_json\n"
        ".previous\n");

extern const char attnd_openapi_json[];
extern const size_t attnd_openapi_json_len;

#define SCHEMAS "#/components/schemas/"

/* Without a key every route answers without one: no security
 * requirement, no scheme, no 401 anywhere. */
static void drop_auth(json_t *doc) {
    json_object_del(doc, "security");
    json_t *comp = json_object_get(doc, "components");
    json_object_del(comp, "securitySchemes");
    json_object_del(json_object_get(comp, "responses"), "E401");
    const char *path, *method;
    json_t *ops, *op;
    json_object_foreach(json_object_get(doc, "paths"), path, ops) {
        json_object_foreach(ops, method, op) {
            json_object_del(op, "security");
            json_object_del(json_object_get(op, "responses"), "401");
        }
    }
}

/* A row of exactly w numbers, each one a float32 holds (past FLT_MAX a
 * number is refused, not rounded to infinity). */
static json_t *row(int w) {
    return json_pack("{s:s, s:i, s:i, s:{s:s, s:f, s:f}}", "type", "array", "minItems", w,
                     "maxItems", w, "items", "type", "number", "minimum", -(double)FLT_MAX,
                     "maximum", (double)FLT_MAX);
}

/* A float input of width w: L rows, B×L rows, or a tensor object. */
static json_t *float_tensor(int w) {
    char desc[96];
    snprintf(desc, sizeof desc, "L×%d or B×L×%d nested arrays of numbers, or a tensor object", w,
             w);
    return json_pack("{s:s, s:[{s:s, s:i, s:o}, {s:s, s:i, s:{s:s, s:i, s:o}}, {s:s}]}",
                     "description", desc, "anyOf", "type", "array", "minItems", 1, "items", row(w),
                     "type", "array", "minItems", 1, "items", "type", "array", "minItems", 1,
                     "items", row(w), "$ref", SCHEMAS "TensorObject");
}

/* Sets the maximum of a schema's items (an array of whole numbers). */
static void items_max(json_t *schema, long long max) {
    json_object_set_new(json_object_get(schema, "items"), "maximum", json_integer(max));
}

/* AttentionRequest fitted to one model: its name, the widths of query,
 * key and value (required when they differ: no self-attention then; a
 * model with rope takes positions below its limit and no key or value),
 * its heads. */
static json_t *attention_request(json_t *schemas, const attnd_model_info *info) {
    const attn_hparams *hp = &info->hp;
    json_t *s = json_deep_copy(json_object_get(schemas, "AttentionRequest"));
    json_t *p = json_object_get(s, "properties");
    if (!p) return s;
    json_object_set_new(p, "model",
                        json_pack("{s:s, s:[s]}", "type", "string", "enum", info->name));
    json_object_set_new(p, "query", float_tensor(hp->embed_dim));
    if (hp->rope.dim) {
        json_object_del(p, "key");
        json_object_del(p, "value");
        long long max = (info->max_positions ? info->max_positions : 1 << 24) - 1;
        json_t *alts = json_object_get(json_object_get(p, "positions"), "oneOf");
        items_max(json_array_get(alts, 0), max);
        items_max(json_object_get(json_array_get(alts, 1), "items"), max);
    } else {
        json_object_set_new(p, "key", float_tensor(hp->kdim));
        json_object_set_new(p, "value", float_tensor(hp->vdim));
        json_object_del(p, "positions");
        if (hp->kdim != hp->embed_dim || hp->vdim != hp->embed_dim) /* no self-attention */
            json_object_set_new(s, "required", json_pack("[s, s, s]", "query", "key", "value"));
    }
    items_max(json_object_get(p, "attention_heads"), hp->num_heads - 1);
    return s;
}

/* One v2 input: its name, the datatypes it takes, its ranks, its data. */
static json_t *v2_input(const char *name, json_t *types, int rmin, int rmax, const char *item) {
    return json_pack("{s:s, s:[s, s, s, s], s:b, s:{s:{s:s, s:[s]}, s:{s:s, s:i, s:i, s:{s:s, "
                     "s:i}}, s:{s:s, s:o}, s:{s:s, s:i, s:{s:s}}, s:{s:s}}}",
                     "type", "object", "required", "name", "shape", "datatype", "data",
                     "additionalProperties", 0, "properties", "name", "type", "string", "enum",
                     name, "shape", "type", "array", "minItems", rmin, "maxItems", rmax, "items",
                     "type", "integer", "minimum", 1, "datatype", "type", "string", "enum", types,
                     "data", "type", "array", "minItems", 1, "items", "type", item, "parameters",
                     "type", "object");
}

/* V2InferRequest fitted to one model: the inputs GET /v2/models/{name}
 * lists, each with the datatypes and ranks it takes. */
static json_t *v2_request(json_t *schemas, const attnd_model_info *info) {
    json_t *s = json_deep_copy(json_object_get(schemas, "V2InferRequest"));
    json_t *in = json_array(), *fp = json_pack("[s, s, s]", "FP32", "FP16", "FP64");
    json_array_append_new(in, v2_input("query", json_copy(fp), 2, 3, "number"));
    if (!info->hp.rope.dim) {
        json_array_append_new(in, v2_input("key", json_copy(fp), 2, 3, "number"));
        json_array_append_new(in, v2_input("value", json_copy(fp), 2, 3, "number"));
    } else {
        json_array_append_new(
            in, v2_input("positions",
                         json_pack("[s, s, s, s, s]", "INT64", "INT32", "FP32", "FP16", "FP64"), 1,
                         2, "integer"));
    }
    json_array_append_new(in,
                          v2_input("key_padding_mask", json_pack("[s]", "BOOL"), 1, 2, "boolean"));
    json_array_append_new(in, v2_input("attn_mask", json_pack("[s]", "BOOL"), 2, 3, "boolean"));
    json_array_append_new(in, v2_input("attn_mask", fp, 2, 3, "number"));
    json_t *inputs = json_object_get(json_object_get(s, "properties"), "inputs");
    json_object_set_new(inputs, "items", json_pack("{s:o}", "anyOf", in));
    return s;
}

/* The operation at ops_path's method, copied for the concrete path of one
 * model: its {name} parameter dropped, its body the schema named ref. */
static json_t *model_op(json_t *paths, const char *ops_path, const char *ref) {
    json_t *op = json_deep_copy(json_object_get(json_object_get(paths, ops_path), "post"));
    json_t *params = json_object_get(op, "parameters");
    for (size_t i = 0; i < json_array_size(params); i++) {
        json_t *in = json_object_get(json_array_get(params, i), "in");
        if (in && strcmp(json_string_value(in), "path") == 0) json_array_remove(params, i--);
    }
    json_t *media = json_object_get(json_object_get(json_object_get(op, "requestBody"), "content"),
                                    "application/json");
    json_object_set_new(media, "schema", json_pack("{s:s}", "$ref", ref));
    return op;
}

/* The model's own schemas and paths: POST /v1/models/<name>/attention and
 * POST /v2/models/<name>/infer beside their {name} forms (a concrete path
 * matches first). /v1/attention keeps the schema of any model. */
static void add_model(json_t *doc, const attnd_model_info *info) {
    json_t *schemas = json_object_get(json_object_get(doc, "components"), "schemas");
    json_t *paths = json_object_get(doc, "paths");
    char name[ATTND_NAME_MAX + 32], ref[ATTND_NAME_MAX + 64], path[ATTND_NAME_MAX + 32];
    snprintf(name, sizeof name, "AttentionRequest_%s", info->name);
    json_object_set_new(schemas, name, attention_request(schemas, info));
    snprintf(ref, sizeof ref, SCHEMAS "%s", name);
    snprintf(path, sizeof path, "/v1/models/%s/attention", info->name);
    json_object_set_new(
        paths, path,
        json_pack("{s:o}", "post", model_op(paths, "/v1/models/{name}/attention", ref)));
    snprintf(name, sizeof name, "V2InferRequest_%s", info->name);
    json_object_set_new(schemas, name, v2_request(schemas, info));
    snprintf(ref, sizeof ref, SCHEMAS "%s", name);
    snprintf(path, sizeof path, "/v2/models/%s/infer", info->name);
    json_object_set_new(
        paths, path, json_pack("{s:o}", "post", model_op(paths, "/v2/models/{name}/infer", ref)));
}

/* The {name} of the GET /v2/models routes gets a model serving as its
 * example (its {version}, the version serving): what a reader tries
 * first, and what a tool that sends the examples gets a model's metadata
 * with, to follow its link to infer. The compute routes have the concrete
 * path of each model instead. */
static void name_examples(json_t *doc, const char *model, int version) {
    char v[16];
    snprintf(v, sizeof v, "%d", version);
    const char *path, *method;
    json_t *ops, *op;
    json_object_foreach(json_object_get(doc, "paths"), path, ops) {
        if (strncmp(path, "/v2/models/{name}", 17) != 0) continue;
        json_object_foreach(ops, method, op) {
            if (strcmp(method, "get") != 0) continue;
            json_t *params = json_object_get(op, "parameters"), *prm;
            size_t i;
            json_array_foreach(params, i, prm) {
                const char *pn = json_string_value(json_object_get(prm, "name"));
                if (pn && (strcmp(pn, "name") == 0 || strcmp(pn, "version") == 0))
                    json_object_set_new(prm, "example", json_string(*pn == 'n' ? model : v));
            }
        }
    }
}

char *attnd_openapi_doc(int keyed, attnd_version *const *vs, int n, size_t *len) {
    json_t *doc = json_loadb(attnd_openapi_json, attnd_openapi_json_len, 0, NULL);
    if (!doc) return NULL;
    if (!keyed) drop_auth(doc);
    if (n > 0) name_examples(doc, vs[0]->info.name, vs[0]->info.version);
    for (int i = 0; i < n; i++)
        add_model(doc, &vs[i]->info);
    char *out = json_dumps(doc, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(doc);
    if (out && len) *len = strlen(out);
    return out;
}
