/* test_safetensors.c - the weights loader (config/weights.c,
 * config/safetensors.c) and the embedded default model.
 *
 *   golden    every case of tests/data/weights/ (made by tests/gen_weights.py
 *             from the torch module that owns the weights: nn.MultiheadAttention,
 *             a TransformerEncoder layer, BERT, BART and Llama attention, a
 *             custom "tensors" map, a layer written by config/export_safetensors.py;
 *             F32, F16, BF16; prefix; kdim != vdim)
 *             is loaded through its config and run through attn_forward_ref
 *             and attn_forward: ||out - torch|| / ||torch|| <= 1e-5.
 *   default   the embedded default model against default_model.json (a
 *             Python re-implementation of its PRNG and torch's output).
 *   refused   malformed files written here, one fault each, and the message
 *             each one gets (it names the file and the tensor).
 *   convert   F16 and BF16 to float32 bit patterns.
 * Run from the repository root (make test-unit), or set ATTND_WEIGHTS_DIR.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../config/config.h"
#include "../config/default_model.h"
#include "../config/safetensors.h"
#include "../core/attn.h"
#include "check_run.h"

static const char *weights_dir(void) {
    const char *d = getenv("ATTND_WEIGHTS_DIR");
    return d && *d ? d : "tests/data/weights";
}

/* ------------------------------------------------------------ helpers */

static json_t *load_json(const char *path) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    ck_assert_msg(j != NULL, "%s: %s (line %d)", path, jerr.text, jerr.line);
    return j;
}

/* Flattens a nested array of numbers; returns a malloc'd array of *n floats. */
static void flatten(const json_t *j, float **dst, size_t *n, size_t *cap) {
    if (json_is_array(j)) {
        size_t i;
        const json_t *x;
        json_array_foreach(j, i, x) flatten(x, dst, n, cap);
        return;
    }
    ck_assert_msg(json_is_number(j), "golden: not a number");
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        *dst = realloc(*dst, *cap * sizeof **dst);
        ck_assert(*dst != NULL);
    }
    (*dst)[(*n)++] = (float)json_number_value(j);
}

static float *floats(const json_t *j, size_t *n) {
    float *p = NULL;
    size_t cap = 0;
    *n = 0;
    if (json_is_null(j)) return NULL;
    flatten(j, &p, n, &cap);
    return p;
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d) / (r > 0 ? sqrt(r) : 1);
}

/* Runs one sequence (L queries, S keys) through both forwards and checks
 * them against want. */
static void check_forward(const attn_model *m, const float *q, size_t L, const float *k,
                          const float *v, size_t S, const float *want, const char *what) {
    char err[256];
    float *out = calloc(L * (size_t)m->hp.embed_dim, sizeof *out);
    ck_assert(out != NULL);
    attn_seq seq = {.L = (int)L, .S = (int)S, .weights = ATTN_WEIGHTS_NONE};
    attn_batch b = {.B = 1, .seqs = &seq, .query = q, .key = k, .value = v, .out = out};
    ck_assert_msg(attn_forward_ref(m, &b, err, sizeof err) == 0, "%s: %s", what, err);
    size_t n = L * (size_t)m->hp.embed_dim;
    double e = rel_err(out, want, n);
    ck_assert_msg(e <= 1e-5, "%s: attn_forward_ref relative error %.3g > 1e-5", what, e);
    attn_ctx *ctx = attn_ctx_new(1);
    ck_assert(ctx != NULL);
    memset(out, 0, n * sizeof *out);
    ck_assert_msg(attn_forward(ctx, m, &b, err, sizeof err) == 0, "%s: %s", what, err);
    e = rel_err(out, want, n);
    ck_assert_msg(e <= 1e-5, "%s: attn_forward relative error %.3g > 1e-5", what, e);
    attn_ctx_free(ctx);
    free(out);
}

/* ------------------------------------------------------------ golden cases */

static const char *const cases[] = {
    "torch_f32",        "torch_f16",         "torch_bf16",          "torch_prefix_f32",
    "torch_prefix_f16", "torch_prefix_bf16", "torch_kdim_vdim_f32", "torch_kdim_vdim_bf16",
    "bert_f32",         "bert_f16",          "hf_bart_f16",         "hf_llama_bf16",
    "tensors_map_f32",  "exported_bf16",
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

START_TEST(golden_case) {
    char path[1024], cfgname[1024], err[512];
    const char *name = cases[_i];
    snprintf(path, sizeof path, "%s/%s.json", weights_dir(), name);
    json_t *g = load_json(path);
    /* The golden's "config" is a config file living in the same folder. */
    char *text = json_dumps(json_object_get(g, "config"), 0);
    ck_assert(text != NULL);
    snprintf(cfgname, sizeof cfgname, "%s/%s.config.json", weights_dir(), name);
    attnd_config c;
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_mem(&c, text, strlen(text), cfgname, 1, err, sizeof err) == 0,
                  "%s: %s", name, err);
    ck_assert_int_eq(c.n_models, 1);
    attn_model m;
    ck_assert_msg(attnd_model_load(&m, &c.models[0], err, sizeof err) == 0, "%s: %s", name, err);
    size_t nq, nk, nv, no;
    float *q = floats(json_object_get(g, "query"), &nq);
    float *k = floats(json_object_get(g, "key"), &nk);
    float *v = floats(json_object_get(g, "value"), &nv);
    float *want = floats(json_object_get(g, "output"), &no);
    size_t E = (size_t)m.hp.embed_dim, L = nq / E;
    size_t S = k ? nk / (size_t)m.hp.kdim : L;
    ck_assert_msg(nq == L * E && no == L * E, "%s: golden shapes", name);
    check_forward(&m, q, L, k, v, S, want, name);
    free(q);
    free(k);
    free(v);
    free(want);
    attn_model_free(&m);
    attnd_config_free(&c);
    free(text);
    json_decref(g);
}
END_TEST

/* The comparison can fail: torch_f16's weights (another draw, same shapes)
 * run on torch_f32's query are far from torch_f32's golden output. */
START_TEST(golden_depends_on_weights) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/torch_f32.json", weights_dir());
    json_t *g = load_json(path);
    size_t nq, no;
    float *q = floats(json_object_get(g, "query"), &nq);
    float *want = floats(json_object_get(g, "output"), &no);
    attnd_config c;
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/x.json", weights_dir());
    const char *text = "{\"models\":[{\"name\":\"other\",\"embed_dim\":16,\"num_heads\":4,"
                       "\"weights\":\"torch_f16.safetensors\"}]}";
    ck_assert(attnd_config_defaults(&c) == 0);
    ck_assert_msg(attnd_config_load_mem(&c, text, strlen(text), cfg, 1, err, sizeof err) == 0, "%s",
                  err);
    attn_model m;
    ck_assert_msg(attnd_model_load(&m, &c.models[0], err, sizeof err) == 0, "%s", err);
    float *out = calloc(no, sizeof *out);
    attn_seq seq = {.L = (int)(nq / 16), .S = (int)(nq / 16)};
    attn_batch b = {.B = 1, .seqs = &seq, .query = q, .out = out};
    ck_assert(attn_forward_ref(&m, &b, err, sizeof err) == 0);
    ck_assert_msg(rel_err(out, want, no) > 0.1, "other weights give the same output");
    free(out);
    free(q);
    free(want);
    attn_model_free(&m);
    attnd_config_free(&c);
    json_decref(g);
}
END_TEST

/* The core's golden files (tests/data/golden/, written by another script
 * from nn.MultiheadAttention) load to exactly the weights their JSON lists. */
static const char *const core_goldens[] = {
    "self_e16_h1",   "self_e30_h3",          "self_e64_h8",
    "nobias_e32_h4", "cross_e48_h4_k40_v24", "nobias_cross_e24_h2_k16_v20",
};

START_TEST(core_golden_weights) {
    char path[1024], wpath[1024], err[512];
    snprintf(path, sizeof path, "tests/data/golden/%s.json", core_goldens[_i]);
    snprintf(wpath, sizeof wpath, "tests/data/golden/%s.safetensors", core_goldens[_i]);
    json_t *g = load_json(path);
    attnd_model_config mc;
    memset(&mc, 0, sizeof mc);
    snprintf(mc.name, sizeof mc.name, "%s", core_goldens[_i]);
    mc.hp.embed_dim = (int)json_integer_value(json_object_get(g, "embed_dim"));
    mc.hp.num_heads = (int)json_integer_value(json_object_get(g, "num_heads"));
    mc.hp.kdim = (int)json_integer_value(json_object_get(g, "kdim"));
    mc.hp.vdim = (int)json_integer_value(json_object_get(g, "vdim"));
    mc.hp.bias = json_is_true(json_object_get(g, "bias"));
    mc.weights = wpath;
    attn_model m;
    ck_assert_msg(attnd_model_load(&m, &mc, err, sizeof err) == 0, "%s", err);
    const char *name;
    json_t *w;
    int seen = 0;
    json_object_foreach(json_object_get(g, "weights"), name, w) {
        const float *got = !strcmp(name, "in_proj_weight")    ? m.q_w
                           : !strcmp(name, "q_proj_weight")   ? m.q_w
                           : !strcmp(name, "k_proj_weight")   ? m.k_w
                           : !strcmp(name, "v_proj_weight")   ? m.v_w
                           : !strcmp(name, "in_proj_bias")    ? m.q_b
                           : !strcmp(name, "out_proj.weight") ? m.out_w
                           : !strcmp(name, "out_proj.bias")   ? m.out_b
                                                              : NULL;
        ck_assert_msg(got != NULL, "%s: unexpected tensor %s", path, name);
        size_t n;
        float *want = floats(w, &n);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(got[i] == want[i], "%s: %s[%zu] = %.9g, JSON says %.9g", path, name, i,
                          got[i], want[i]);
        free(want);
        seen++;
    }
    ck_assert_int_ge(seen, 2);
    attn_model_free(&m);
    json_decref(g);
}
END_TEST

/* ------------------------------------------------------------ default model */

static void expect_floats(const float *got, const json_t *want, const char *what) {
    size_t n;
    float *w = floats(want, &n);
    ck_assert_msg(n == 8, "%s: golden has %zu values", what, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == w[i], "%s[%zu]: %.9g, golden %.9g", what, i, got[i], w[i]);
    free(w);
}

START_TEST(default_model_golden) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/default_model.json", weights_dir());
    json_t *g = load_json(path);
    ck_assert(json_integer_value(json_object_get(g, "seed")) == (json_int_t)ATTND_DEFAULT_SEED);
    attn_model m;
    ck_assert_msg(attnd_default_model(&m, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(m.hp.embed_dim, 512);
    ck_assert_int_eq(m.hp.num_heads, 8);
    size_t E = 512;
    expect_floats(m.q_w, json_object_get(g, "in_proj_weight_head"), "in_proj_weight head");
    expect_floats(m.v_w + E * E - 8, json_object_get(g, "in_proj_weight_tail"),
                  "in_proj_weight tail");
    expect_floats(m.out_w, json_object_get(g, "out_proj_weight_head"), "out_proj.weight head");
    for (size_t i = 0; i < E; i++)
        ck_assert(m.q_b[i] == 0 && m.out_b[i] == 0);
    size_t nq, no;
    float *q = floats(json_object_get(g, "query"), &nq);
    float *want = floats(json_object_get(g, "output"), &no);
    check_forward(&m, q, nq / E, NULL, NULL, nq / E, want, "default model");
    free(q);
    free(want);
    attn_model_free(&m);
    json_decref(g);
}
END_TEST

/* attnd_config_from_args with no config gives a model that attnd_model_load
 * turns into exactly the default weights. */
START_TEST(default_model_via_config) {
    char err[256];
    char *argv[] = {"attnd", NULL};
    int help;
    attnd_config c;
    unsetenv("ATTND_CONFIG");
    ck_assert_msg(attnd_config_from_args(&c, 1, argv, &help, err, sizeof err) == 0, "%s", err);
    attn_model a, b;
    ck_assert_msg(attnd_model_load(&a, &c.models[0], err, sizeof err) == 0, "%s", err);
    ck_assert(attnd_default_model(&b, err, sizeof err) == 0);
    ck_assert(a.n_floats == b.n_floats);
    ck_assert(memcmp(a.mem, b.mem, a.n_floats * sizeof(float)) == 0);
    /* xavier over (3E,E): bound sqrt(6/4E); kaiming(a=sqrt 5): 1/sqrt(E). */
    double in_b = sqrt(6.0 / 2048), out_b = 1 / sqrt(512.0), in_max = 0, out_max = 0;
    for (size_t i = 0; i < 3 * 512 * 512; i++)
        in_max = fmax(in_max, fabs(a.q_w[i]));
    for (size_t i = 0; i < 512 * 512; i++)
        out_max = fmax(out_max, fabs(a.out_w[i]));
    ck_assert(in_max <= in_b && in_max > 0.99 * in_b);
    ck_assert(out_max <= out_b && out_max > 0.99 * out_b);
    attn_model_free(&a);
    attn_model_free(&b);
    attnd_config_free(&c);
}
END_TEST

/* ------------------------------------------------------------ malformed files */

/* A small valid file: torch layout, E = 4, H = 2, F32. */
typedef struct {
    const char *name, *dtype, *shape;
    long long begin, end;
} entry;

static const entry good[] = {
    {"in_proj_weight", "F32", "[12,4]", 0, 192},
    {"in_proj_bias", "F32", "[12]", 192, 240},
    {"out_proj.weight", "F32", "[4,4]", 240, 304},
    {"out_proj.bias", "F32", "[4]", 304, 320},
};
#define N_GOOD 4
#define GOOD_DATA 320

static char g_dir[256];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/attnd-st-XXXXXX");
    ck_assert(mkdtemp(g_dir) != NULL);
}

/* The bytes of a file: 8-byte length (or forced_len when >= 0), header,
 * data_len bytes of data (small floats), cut to keep bytes when >= 0. */
static unsigned char *file_bytes(const char *header, long long forced_len, size_t data_len,
                                 long long keep, size_t *size) {
    size_t hl = strlen(header), total = 8 + hl + data_len;
    unsigned char *b = calloc(total + 1, 1);
    ck_assert(b != NULL);
    unsigned long long n = forced_len >= 0 ? (unsigned long long)forced_len : hl;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(n >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i + 4 <= data_len; i += 4) {
        float f = (float)(i % 97) * 0.01f;
        memcpy(b + 8 + hl + i, &f, 4);
    }
    *size = keep >= 0 && (size_t)keep < total ? (size_t)keep : total;
    return b;
}

static char *header_of(const entry *e, int n) {
    static char h[4096];
    size_t at = (size_t)snprintf(h, sizeof h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++)
        at +=
            (size_t)snprintf(h + at, sizeof h - at,
                             ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%lld,%lld]}",
                             e[i].name, e[i].dtype, e[i].shape, e[i].begin, e[i].end);
    snprintf(h + at, sizeof h - at, "}");
    return h;
}

static attnd_model_config small_model(const char *path, const char *layout) {
    attnd_model_config mc;
    memset(&mc, 0, sizeof mc);
    snprintf(mc.name, sizeof mc.name, "small");
    mc.hp = (attn_hparams){.embed_dim = 4, .num_heads = 2, .kdim = 4, .vdim = 4, .bias = 1};
    mc.weights = (char *)path;
    mc.prefix = "";
    mc.layout = (char *)layout;
    return mc;
}

/* Loads the bytes as a file and from memory with mc; returns 0 or -1, and
 * the file's message in err. Both roads must agree. */
static int load_bytes(const unsigned char *b, size_t size, attnd_model_config *mc, char *err,
                      size_t errlen) {
    char path[512], err2[512];
    snprintf(path, sizeof path, "%s/w.safetensors", g_dir);
    FILE *f = fopen(path, "wb");
    ck_assert(f && fwrite(b, 1, size, f) == size && fclose(f) == 0);
    mc->weights = path;
    attn_model m, m2;
    int rc = attnd_model_load(&m, mc, err, errlen);
    int rc2 = attnd_model_load_mem(&m2, mc, b, size, path, err2, sizeof err2);
    ck_assert_msg(rc == rc2, "file and memory loads disagree: %s / %s", err, err2);
    if (rc == 0) {
        ck_assert(memcmp(m.mem, m2.mem, m.n_floats * sizeof(float)) == 0);
    } else {
        ck_assert_msg(strcmp(err, err2) == 0, "messages differ: %s / %s", err, err2);
        ck_assert(m.mem == NULL && m2.mem == NULL);
    }
    attn_model_free(&m);
    attn_model_free(&m2);
    unlink(path);
    return rc;
}

/* Expects the file to be refused with a message naming the file and
 * holding want and want2 (when not NULL). */
static void expect_refused(const unsigned char *b, size_t size, const char *layout,
                           const char *want, const char *want2) {
    char err[512];
    make_dir();
    attnd_model_config mc = small_model(NULL, layout);
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == -1, "accepted; wanted: %s", want);
    ck_assert_msg(strstr(err, g_dir) != NULL, "message does not name the file: %s", err);
    ck_assert_msg(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"", err, want);
    ck_assert_msg(!want2 || strstr(err, want2) != NULL, "message \"%s\" lacks \"%s\"", err, want2);
    rmdir(g_dir);
}

static void refuse_entries(const entry *e, int n, size_t data_len, const char *want,
                           const char *want2) {
    size_t size;
    unsigned char *b = file_bytes(header_of(e, n), -1, data_len, -1, &size);
    expect_refused(b, size, "torch", want, want2);
    free(b);
}

START_TEST(good_file_loads) {
    char err[512];
    size_t size;
    unsigned char *b = file_bytes(header_of(good, N_GOOD), -1, GOOD_DATA, -1, &size);
    make_dir();
    attnd_model_config mc = small_model(NULL, "torch");
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == 0, "%s", err);
    /* out_proj.bias is the last 4 floats of the data: 0.76..0.88 pattern. */
    attn_model m;
    ck_assert(attnd_model_load_mem(&m, &mc, b, size, "mem", err, sizeof err) == 0);
    float f;
    memcpy(&f, b + size - 4, 4);
    ck_assert(m.out_b[3] == f);
    memcpy(&f, b + 8 + strlen(header_of(good, N_GOOD)) + 4 * 4 * 4, 4);
    ck_assert(m.k_w[0] == f); /* k rows start at row 4 of in_proj_weight */
    attn_model_free(&m);
    rmdir(g_dir);
    free(b);
}
END_TEST

START_TEST(refuse_too_short) {
    size_t size;
    unsigned char *b = file_bytes(header_of(good, N_GOOD), -1, GOOD_DATA, 5, &size);
    expect_refused(b, size, "torch", "too short", "truncated");
    free(b);
}
END_TEST

START_TEST(refuse_truncated_header) {
    size_t size;
    unsigned char *b = file_bytes(header_of(good, N_GOOD), -1, 0, 40, &size);
    expect_refused(b, size, "torch", "runs past the end of the file", "truncated");
    free(b);
}
END_TEST

START_TEST(refuse_truncated_data) {
    size_t size;
    unsigned char *b = file_bytes(header_of(good, N_GOOD), -1, GOOD_DATA, -1, &size);
    expect_refused(b, size - 10, "torch", "\"out_proj.bias\"", "past the end of the file");
    free(b);
}
END_TEST

START_TEST(refuse_offsets_past_end) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[2].begin = 320, e[2].end = 384;
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"out_proj.weight\"", "past the end");
}
END_TEST

START_TEST(refuse_overlap) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[3].begin = 300, e[3].end = 316;
    refuse_entries(e, N_GOOD, GOOD_DATA, "overlap", "\"out_proj.bias\"");
}
END_TEST

START_TEST(refuse_reversed_offsets) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[3].begin = 320, e[3].end = 304;
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"out_proj.bias\"", "reversed");
}
END_TEST

START_TEST(refuse_span_mismatch) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[3].shape = "[5]";
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"out_proj.bias\"", "needs 20");
}
END_TEST

START_TEST(refuse_absurd_header_length) {
    size_t size;
    unsigned char *b = file_bytes(header_of(good, N_GOOD), 1LL << 40, GOOD_DATA, -1, &size);
    expect_refused(b, size, "torch", "absurd header length", NULL);
    free(b);
}
END_TEST

START_TEST(refuse_header_not_json) {
    size_t size;
    unsigned char *b = file_bytes("{\"in_proj_weight\": {\"dtype\": F32}}", -1, 0, -1, &size);
    expect_refused(b, size, "torch", "header is not valid JSON", NULL);
    free(b);
    b = file_bytes("[1, 2]", -1, 0, -1, &size);
    expect_refused(b, size, "torch", "not a JSON object", NULL);
    free(b);
}
END_TEST

START_TEST(refuse_unknown_dtype) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[1].dtype = "F17";
    refuse_entries(e, N_GOOD, GOOD_DATA, "unknown dtype \"F17\"", "\"in_proj_bias\"");
}
END_TEST

/* The dtypes of newer safetensors releases (complex, the MX formats' scales
 * and packed sub-byte floats): unused, they are skipped like any other,
 * their spans still checked (packed elements fill whole bytes); used, the
 * model is refused for its dtype. */
START_TEST(newer_dtypes_unused) {
    static const entry extra[] = {
        {"c", "C64", "[3]", 320, 344},      {"s", "F8_E8M0", "[5]", 344, 349},
        {"f4", "F4", "[2,3]", 349, 352},    {"f6", "F6_E2M3", "[4]", 352, 355},
        {"g6", "F6_E3M2", "[3]", 355, 358},
    };
    entry e[N_GOOD + 5];
    memcpy(e, good, sizeof good);
    memcpy(e + N_GOOD, extra, sizeof extra);
    char err[512];
    size_t size;
    unsigned char *b = file_bytes(header_of(e, N_GOOD + 5), -1, 358, -1, &size);
    make_dir();
    attnd_model_config mc = small_model(NULL, "torch");
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == 0, "%s", err);
    rmdir(g_dir);
    free(b);
    e[N_GOOD + 2].end = 353; /* 6 F4 elements are 3 bytes, not 4 */
    e[N_GOOD + 3].begin = 353, e[N_GOOD + 3].end = 356;
    e[N_GOOD + 4].begin = 356, e[N_GOOD + 4].end = 359;
    refuse_entries(e, N_GOOD + 5, 359, "F4 with 6 elements needs 3", "\"f4\"");
    memcpy(e, good, sizeof good);
    e[1] = (entry){"in_proj_bias", "C64", "[12]", 192, 288};
    e[2].begin = 288, e[2].end = 352;
    e[3].begin = 352, e[3].end = 368;
    refuse_entries(e, N_GOOD, 368, "dtype C64", "\"in_proj_bias\"");
}
END_TEST

START_TEST(refuse_unreadable_dtype) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[1].dtype = "I32";
    refuse_entries(e, N_GOOD, GOOD_DATA, "dtype I32", "\"in_proj_bias\"");
}
END_TEST

START_TEST(refuse_missing_tensor) {
    refuse_entries(good, N_GOOD - 1, GOOD_DATA, "\"out_proj.bias\" is missing", "out_bias");
}
END_TEST

START_TEST(refuse_wrong_shape) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[0].shape = "[4,12]";
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"in_proj_weight\" has shape [4, 12]", "[12, 4]");
    e[0].shape = "[48]";
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"in_proj_weight\" has shape [48]", "[12, 4]");
}
END_TEST

START_TEST(refuse_bad_entry) {
    entry e[N_GOOD];
    memcpy(e, good, sizeof e);
    e[2].shape = "[4,-4]";
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"out_proj.weight\"", "shape[1]");
    e[2].shape = "[1,1,1,1,1,1,1,1,16]";
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"out_proj.weight\"", "at most 8");
    e[2].shape = "\"4x4\"";
    refuse_entries(e, N_GOOD, GOOD_DATA, "\"out_proj.weight\"", "\"shape\"");
}
END_TEST

START_TEST(refuse_nan_weight) {
    size_t size;
    unsigned char *b = file_bytes(header_of(good, N_GOOD), -1, GOOD_DATA, -1, &size);
    float nan = NAN;
    memcpy(b + size - 8, &nan, 4); /* out_proj.bias[2] */
    expect_refused(b, size, "torch", "\"out_proj.bias\": element 2 is NaN or Inf", NULL);
    free(b);
}
END_TEST

/* A weight past bf16's range: a bf16 model (its weights held in bf16) is
 * refused, naming the tensor and the element; an fp32 or int8 model of the
 * same file loads, and so does a bf16 model whose large value is a bias
 * (biases stay fp32) or just inside the range. */
START_TEST(refuse_bf16_overflow) {
    size_t size, at; /* where the data start, after the header */
    unsigned char *b = file_bytes(header_of(good, N_GOOD), -1, GOOD_DATA, -1, &size);
    at = size - GOOD_DATA;
    char err[512];
    const float big = 3.4e38f, inside = 3.39e38f;
    memcpy(b + at + 240 + 4 * 5, &big, 4); /* out_proj.weight element 5 */
    make_dir();
    attnd_model_config mc = small_model(NULL, "torch");
    mc.hp.precision = ATTN_BF16;
    ck_assert_int_eq(load_bytes(b, size, &mc, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "\"out_proj.weight\": element 5, 3.4e+38, is past bf16's largest"),
                  "%s", err);
    mc.hp.precision = ATTN_FP32;
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == 0, "%s", err);
    mc.hp.precision = ATTN_INT8;
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == 0, "%s", err);
    memcpy(b + at + 240 + 4 * 5, &inside, 4);
    mc.hp.precision = ATTN_BF16;
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == 0, "%s", err);
    memcpy(b + at + 304, &big, 4); /* out_proj.bias[0] */
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == 0, "%s", err);
    rmdir(g_dir);
    free(b);
}
END_TEST

/* hf_proj: out_proj.* or o_proj.*, but not both. */
static const entry hf[] = {
    {"q_proj.weight", "F32", "[4,4]", 0, 64},      {"q_proj.bias", "F32", "[4]", 64, 80},
    {"k_proj.weight", "F32", "[4,4]", 80, 144},    {"k_proj.bias", "F32", "[4]", 144, 160},
    {"v_proj.weight", "F32", "[4,4]", 160, 224},   {"v_proj.bias", "F32", "[4]", 224, 240},
    {"o_proj.weight", "F32", "[4,4]", 240, 304},   {"o_proj.bias", "F32", "[4]", 304, 320},
    {"out_proj.weight", "F32", "[4,4]", 320, 384},
};

START_TEST(hf_proj_out_names) {
    char err[512];
    size_t size;
    unsigned char *b = file_bytes(header_of(hf, 8), -1, 384, -1, &size);
    make_dir();
    attnd_model_config mc = small_model(NULL, "hf_proj");
    ck_assert_msg(load_bytes(b, size, &mc, err, sizeof err) == 0, "o_proj: %s", err);
    rmdir(g_dir);
    free(b);
    b = file_bytes(header_of(hf, 9), -1, 384, -1, &size);
    expect_refused(b, size, "hf_proj", "both \"out_proj.weight\" and \"o_proj.weight\"", NULL);
    free(b);
    b = file_bytes(header_of(hf, 6), -1, 384, -1, &size);
    expect_refused(b, size, "hf_proj", "\"out_proj.weight\" (or \"o_proj.weight\") is missing",
                   NULL);
    free(b);
}
END_TEST

START_TEST(wrong_prefix_names_full_tensor) {
    char err[512];
    size_t size;
    unsigned char *b = file_bytes(header_of(good, N_GOOD), -1, GOOD_DATA, -1, &size);
    make_dir();
    attnd_model_config mc = small_model(NULL, "torch");
    mc.prefix = "encoder.layers.3.self_attn.";
    ck_assert(load_bytes(b, size, &mc, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "\"encoder.layers.3.self_attn.in_proj_weight\" is missing"), "%s",
                  err);
    rmdir(g_dir);
    free(b);
}
END_TEST

START_TEST(missing_file) {
    char err[512];
    attnd_model_config mc = small_model("/nonexistent/w.safetensors", "torch");
    attn_model m;
    ck_assert(attnd_model_load(&m, &mc, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "/nonexistent/w.safetensors") && strstr(err, "cannot open"), "%s",
                  err);
    ck_assert(m.mem == NULL);
}
END_TEST

/* ------------------------------------------------------------ conversion */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

START_TEST(f16_bf16_conversion) {
    ck_assert(st_f16_to_f32(0x3c00) == 1.0f);
    ck_assert(st_f16_to_f32(0xc000) == -2.0f);
    ck_assert(st_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(st_f16_to_f32(0x0001) == 0x1p-24f); /* smallest subnormal */
    ck_assert(st_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    ck_assert(st_f16_to_f32(0x0400) == 0x1p-14f); /* smallest normal */
    ck_assert(bits(st_f16_to_f32(0x8000)) == 0x80000000u);
    ck_assert(isinf(st_f16_to_f32(0x7c00)) && st_f16_to_f32(0xfc00) < 0);
    ck_assert(isnan(st_f16_to_f32(0x7e00)));
    ck_assert(st_f16_to_f32(0x3555) == 0x1.554p-2f);
    ck_assert(st_bf16_to_f32(0x3f80) == 1.0f);
    ck_assert(st_bf16_to_f32(0xc0a0) == -5.0f);
    ck_assert(st_bf16_to_f32(0x3e20) == 0.15625f);
    unsigned char le[4] = {0x00, 0x00, 0x80, 0x3f};
    float f;
    st_to_f32(&f, le, ST_F32, 1);
    ck_assert(f == 1.0f);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("safetensors");
    TCase *t = tcase_create("golden");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, golden_case, 0, N_CASES);
    tcase_add_test(t, golden_depends_on_weights);
    tcase_add_loop_test(t, core_golden_weights, 0,
                        (int)(sizeof core_goldens / sizeof core_goldens[0]));
    tcase_add_test(t, default_model_golden);
    tcase_add_test(t, default_model_via_config);
    suite_add_tcase(s, t);
    t = tcase_create("refused");
    tcase_add_test(t, good_file_loads);
    tcase_add_test(t, refuse_too_short);
    tcase_add_test(t, refuse_truncated_header);
    tcase_add_test(t, refuse_truncated_data);
    tcase_add_test(t, refuse_offsets_past_end);
    tcase_add_test(t, refuse_overlap);
    tcase_add_test(t, refuse_reversed_offsets);
    tcase_add_test(t, refuse_span_mismatch);
    tcase_add_test(t, refuse_absurd_header_length);
    tcase_add_test(t, refuse_header_not_json);
    tcase_add_test(t, refuse_unknown_dtype);
    tcase_add_test(t, newer_dtypes_unused);
    tcase_add_test(t, refuse_unreadable_dtype);
    tcase_add_test(t, refuse_missing_tensor);
    tcase_add_test(t, refuse_wrong_shape);
    tcase_add_test(t, refuse_bad_entry);
    tcase_add_test(t, refuse_nan_weight);
    tcase_add_test(t, refuse_bf16_overflow);
    tcase_add_test(t, hf_proj_out_names);
    tcase_add_test(t, wrong_prefix_names_full_tensor);
    tcase_add_test(t, missing_file);
    suite_add_tcase(s, t);
    t = tcase_create("convert");
    tcase_add_test(t, f16_bf16_conversion);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(suite());
}
