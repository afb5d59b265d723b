/* decoder.c - the decoder options of a model in the config file: the "rope"
 * object (theta, dim, style, and a Hugging Face style "scaling" object), and
 * the checks that tie num_kv_heads, head_dim, scale, rope, max_positions and
 * the layout together, each refusal naming the key and the reason. It also
 * settles the defaults that depend on the layout (bias, causal).
 * It reads no files; read.c calls it for each model (docs/config.md,
 * "Decoder models").
 */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "decoder.h"
#include "enums.h"
#include "refuse.h"

/* A JSON number (integer or not) as a double. Returns 0, or -1 when v is
 * not a finite number. */
static int json_number(const json_t *v, double *out) {
    if (!json_is_number(v)) return -1;
    *out = json_number_value(v);
    return isfinite(*out) ? 0 : -1;
}

/* A number that must be > 0 (and <= max when max > 0). */
static int positive(const json_t *v, double max, double *out, const char *src, const char *key,
                    char *err, size_t errlen) {
    if (json_number(v, out) != 0)
        return cfg_fail(err, errlen, "%s: %s: must be a number.", src, key);
    if (!(*out > 0) || (max > 0 && *out > max))
        return cfg_fail(err, errlen, "%s: %s: %g is out of range (0, %g].", src, key, *out,
                        max > 0 ? max : INFINITY);
    return 0;
}

static int integer(const json_t *v, long long lo, long long hi, int *out, const char *src,
                   const char *key, char *err, size_t errlen) {
    int whole = json_is_real(v) && cfg_whole(json_real_value(v)); /* 8192.0 */
    if (!json_is_integer(v) && !whole)
        return cfg_fail(err, errlen, "%s: %s: must be an integer.", src, key);
    long long x = whole ? (long long)json_real_value(v) : json_integer_value(v);
    if (x < lo || x > hi)
        return cfg_fail(err, errlen, "%s: %s: %lld is out of range [%lld, %lld].", src, key, x, lo,
                        hi);
    *out = (int)x;
    return 0;
}

/* One of the words of table e into *out. */
static int word(const json_t *v, const attnd_enum *e, int *out, const char *src, const char *key,
                char *err, size_t errlen) {
    char words[120];
    if (attnd_enum_value(e, json_string_value(v), out) < 0)
        return cfg_fail(err, errlen, "%s: %s: must be %s.", src, key,
                        attnd_enum_list(e, " or ", words, sizeof words));
    return 0;
}

static const char *const scaling_keys[] = {
    "type",
    "rope_type",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
    "truncate",
};
#define N_SCALING_KEYS (int)countof(scaling_keys)

/* The numbers of a "scaling" object after its type: what each is, the
 * field of attn_rope it goes to, and which types take it (must, may). */
enum { TAKE_NO, TAKE_MAY, TAKE_MUST };
/* > 0; >= 0 where 0 is the default, as Hugging Face reads YaRN's betas and
 * mscales ("or 32", "if mscale and mscale_all_dim"); a length >= 1; a boolean */
enum { NUM_REAL, NUM_REAL0, NUM_CONTEXT, NUM_TRUNCATE };
typedef struct {
    const char *key;
    int kind;
    size_t off;
    char take[4]; /* by attn_rope_scaling: none, linear, llama3, yarn */
} scaling_number;
// clang-format off
#define SN(key, kind, field, l, l3, y) {key, kind, offsetof(attn_rope, field), {TAKE_NO, l, l3, y}}
// clang-format on
static const scaling_number scaling_numbers_table[] = {
    SN("factor", NUM_REAL, factor, TAKE_MUST, TAKE_MUST, TAKE_MUST),
    SN("low_freq_factor", NUM_REAL, low_freq_factor, TAKE_NO, TAKE_MUST, TAKE_NO),
    SN("high_freq_factor", NUM_REAL, high_freq_factor, TAKE_NO, TAKE_MUST, TAKE_NO),
    SN("original_max_position_embeddings", NUM_CONTEXT, original_max_position, TAKE_NO, TAKE_MUST,
       TAKE_MUST),
    SN("beta_fast", NUM_REAL0, beta_fast, TAKE_NO, TAKE_NO, TAKE_MAY),
    SN("beta_slow", NUM_REAL0, beta_slow, TAKE_NO, TAKE_NO, TAKE_MAY),
    SN("mscale", NUM_REAL0, mscale, TAKE_NO, TAKE_NO, TAKE_MAY),
    SN("mscale_all_dim", NUM_REAL0, mscale_all_dim, TAKE_NO, TAKE_NO, TAKE_MAY),
    SN("attention_factor", NUM_REAL, attention_factor, TAKE_NO, TAKE_NO, TAKE_MAY),
    SN("truncate", NUM_TRUNCATE, exact_range, TAKE_NO, TAKE_NO, TAKE_MAY),
};
#define N_SCALING_NUMBERS (int)countof(scaling_numbers_table)

/* Sets r->scaling from "type" or "rope_type" (Hugging Face configs often
 * carry both, since older code reads "type": the same value twice is one
 * type, two values are a contradiction). "default" is Hugging Face's name
 * for no scaling. *type is the name given. */
static int scaling_type(attn_rope *r, json_t *obj, const char **type, const char *src,
                        const char *path, char *err, size_t errlen) {
    char key[320];
    int scaling;
    json_t *t = json_object_get(obj, "type"), *rt = json_object_get(obj, "rope_type");
    snprintf(key, sizeof key, "%.200s.%s", path, t ? "type" : "rope_type");
    if (t && rt && !json_equal(t, rt))
        return cfg_fail(err, errlen,
                        "%s: %s: \"type\" and \"rope_type\" differ; give one, or both the same.",
                        src, path);
    *type = json_string_value(t ? t : rt);
    char words[80];
    attnd_enum_list(&attnd_rope_scalings, " or ", words, sizeof words);
    if (!*type)
        return cfg_fail(err, errlen, "%s: %s: missing or not a string; %s.", src, key, words);
    if (strcmp(*type, "default") == 0) {
        r->scaling = ATTN_ROPE_SCALE_NONE;
        return 0;
    }
    int by_length = strcmp(*type, "dynamic") == 0 || strcmp(*type, "longrope") == 0;
    if (attnd_enum_value(&attnd_rope_scalings, *type, &scaling) < 0)
        return cfg_fail(err, errlen, "%s: %s: \"%.60s\" is not %s%s.", src, key, *type, words,
                        by_length ? "; its frequencies change with the length of each sequence, "
                                    "which the keys already in a KV cache cannot follow"
                                  : "");
    r->scaling = (attn_rope_scaling)scaling;
    return 0;
}

/* The types that take table row i, as a subject and its verb: "llama3
 * scaling takes", "llama3 and yarn scaling take". */
static const char *takers(int i, char *buf, size_t cap) {
    const char *names[] = {"", "linear", "llama3", "yarn"};
    const char *take = scaling_numbers_table[i].take;
    int n = 0, k = 0;
    for (int t = 1; t < 4; t++)
        n += take[t] != TAKE_NO;
    buf[0] = '\0';
    for (int t = 1; t < 4; t++) {
        if (take[t] == TAKE_NO) continue;
        const char *sep = k == 0 ? "" : k == n - 1 ? " and " : ", ";
        k++;
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", sep, names[t]);
    }
    snprintf(buf + strlen(buf), cap - strlen(buf), " scaling take%s", n > 1 ? "" : "s");
    return buf;
}

/* Stores the value x of row n into r, checked. truncate: false keeps
 * YaRN's bounds unrounded (exact_range). */
static int scaling_value(attn_rope *r, const scaling_number *n, json_t *x, const char *src,
                         const char *key, char *err, size_t errlen) {
    char *field = (char *)r + n->off;
    if (n->kind == NUM_CONTEXT) return integer(x, 1, 1 << 30, (int *)field, src, key, err, errlen);
    if (n->kind == NUM_REAL) return positive(x, 1e6, (double *)field, src, key, err, errlen);
    if (n->kind == NUM_REAL0 && json_is_number(x) && json_number_value(x) == 0) return 0;
    if (n->kind == NUM_REAL0 && json_is_number(x) && json_number_value(x) < 0)
        return cfg_fail(err, errlen, "%s: %s: %g is out of range [0, 1e+06] (0: the default).", src,
                        key, json_number_value(x));
    if (n->kind == NUM_REAL0) return positive(x, 1e6, (double *)field, src, key, err, errlen);
    if (!json_is_boolean(x))
        return cfg_fail(err, errlen, "%s: %s: must be true or false.", src, key);
    *(int *)field = json_is_false(x);
    return 0;
}

/* The numbers r->scaling takes (scaling_numbers_table), each given or
 * not as the type says; llama3's low_freq_factor < high_freq_factor. */
static int scaling_numbers(attn_rope *r, json_t *obj, const char *type, const char *src,
                           const char *path, char *err, size_t errlen) {
    char key[320], who[64];
    for (int i = 0; i < N_SCALING_NUMBERS; i++) {
        const char *name = scaling_numbers_table[i].key;
        int take = scaling_numbers_table[i].take[r->scaling];
        json_t *x = json_object_get(obj, name);
        if (json_is_null(x)) x = NULL; /* null is the key left out, as Python writes None */
        snprintf(key, sizeof key, "%.200s.%s", path, name);
        if (!x && take == TAKE_MUST)
            return cfg_fail(err, errlen, "%s: %s: missing; %s scaling needs it.", src, key, type);
        if (x && take == TAKE_NO && r->scaling == ATTN_ROPE_SCALE_NONE)
            return cfg_fail(err, errlen, "%s: %s: \"default\" is no scaling and takes no numbers.",
                            src, key);
        if (x && take == TAKE_NO)
            return cfg_fail(err, errlen, "%s: %s: only %s it.", src, key,
                            takers(i, who, sizeof who));
        if (x && scaling_value(r, &scaling_numbers_table[i], x, src, key, err, errlen)) return -1;
    }
    if (r->scaling == ATTN_ROPE_SCALE_LLAMA3 && !(r->high_freq_factor > r->low_freq_factor))
        return cfg_fail(err, errlen,
                        "%s: %s.high_freq_factor: %g must be greater than low_freq_factor %g.", src,
                        path, r->high_freq_factor, r->low_freq_factor);
    return 0;
}

/* The "scaling" object: {"type": "linear", "factor": F}, {"type":
 * "llama3", "factor", "low_freq_factor", "high_freq_factor",
 * "original_max_position_embeddings"} or {"type": "yarn", "factor",
 * "original_max_position_embeddings", and optionally "beta_fast",
 * "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
 * "truncate"}, as Hugging Face's rope_scaling
 * (whose "rope_type" is taken for "type"; both may be given when equal).
 * null and {"type": "default"} are no scaling, as Hugging Face writes it. */
static int parse_scaling(attn_rope *r, json_t *obj, const char *src, const char *path, char *err,
                         size_t errlen) {
    char hint[160];
    r->scaling = ATTN_ROPE_SCALE_NONE;
    if (json_is_null(obj)) return 0;
    if (!json_is_object(obj)) return cfg_fail(err, errlen, "%s: %s: must be an object.", src, path);
    const char *name, *type = NULL;
    json_t *v;
    json_object_foreach(obj, name, v) {
        if (cfg_name_index(name, scaling_keys, N_SCALING_KEYS) < 0)
            return cfg_fail(
                err, errlen, "%s: %s.%.60s: unknown key%s.", src, path, name,
                cfg_did_you_mean(name, scaling_keys, N_SCALING_KEYS, hint, sizeof hint));
    }
    if (scaling_type(r, obj, &type, src, path, err, errlen) != 0) return -1;
    return scaling_numbers(r, obj, type, src, path, err, errlen);
}

static const char *const rope_keys[] = {"theta", "dim", "style", "scaling"};
#define N_ROPE_KEYS (int)countof(rope_keys)

int attnd_rope_parse(attnd_model_config *mc, json_t *obj, const char *src, const char *path,
                     char *err, size_t errlen) {
    attn_rope *r = &mc->hp.rope;
    char key[320], hint[160];
    if (json_is_null(obj)) { /* as if left out: no rotary positions */
        *r = (attn_rope){.dim = 0};
        return 0;
    }
    if (!json_is_object(obj))
        return cfg_fail(err, errlen,
                        "%s: %s: must be an object, like {\"theta\": 10000} (or null: no rope).",
                        src, path);
    *r = (attn_rope){.dim = -1, .theta = 10000, .style = ATTN_ROPE_HALF}; /* dim -1: D */
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        int i = cfg_name_index(name, rope_keys, N_ROPE_KEYS);
        snprintf(key, sizeof key, "%.200s.%.60s", path, name);
        if (i < 0)
            return cfg_fail(err, errlen, "%s: %s: unknown key%s.", src, key,
                            cfg_did_you_mean(name, rope_keys, N_ROPE_KEYS, hint, sizeof hint));
        int bad = 0;
        if (i == 0) bad = positive(v, 1e12, &r->theta, src, key, err, errlen);
        if (i == 1) bad = integer(v, 2, 65536, &r->dim, src, key, err, errlen);
        if (i == 1 && !bad && r->dim % 2)
            return cfg_fail(err, errlen,
                            "%s: %s: %d is odd; rotary positions turn pairs of columns, so it "
                            "must be even.",
                            src, key, r->dim);
        if (i == 2) bad = word(v, &attnd_rope_styles, (int *)&r->style, src, key, err, errlen);
        if (i == 3) bad = parse_scaling(r, v, src, key, err, errlen);
        if (bad) return -1;
    }
    if (r->scaling == ATTN_ROPE_SCALE_YARN && r->theta == 1) /* YaRN divides by ln(theta) */
        return cfg_fail(err, errlen,
                        "%s: %s.theta: 1 turns every pair alike; yarn scaling needs a theta "
                        "other than 1.",
                        src, path);
    return 0;
}

/* The defaults that depend on the layout: llama layouts have no biases and
 * are causal, unless the config says otherwise. */
static void layout_defaults(attnd_model_config *mc, int layout) {
    int llama = layout == ATTND_LAYOUT_LLAMA;
    if (mc->hp.bias < 0) mc->hp.bias = !llama;
    if (mc->hp.causal < 0) mc->hp.causal = llama;
}

int attnd_model_check(attnd_model_config *mc, const char *at, const char *src, char *err,
                      size_t errlen) {
    attn_hparams *hp = &mc->hp;
    int E = hp->embed_dim, H = hp->num_heads, layout = ATTND_LAYOUT_TORCH;
    if (mc->layout) attnd_enum_value(&attnd_layouts, mc->layout, &layout); /* checked when read */
    layout_defaults(mc, layout);
    int precision = ATTN_FP32;
    if (mc->precision) attnd_enum_value(&attnd_precisions, mc->precision, &precision); /* too */
    hp->precision = (attn_precision)precision;
    if (hp->kdim == 0) hp->kdim = E;
    if (hp->vdim == 0) hp->vdim = E;
    if (hp->head_dim == 0 && E % H != 0)
        return cfg_fail(err, errlen,
                        "%s: %snum_heads: %d does not divide embed_dim %d (E must be "
                        "divisible by H, or give head_dim).",
                        src, at, H, E);
    int D = attn_hparams_head_dim(hp);
    if (hp->num_kv_heads && H % hp->num_kv_heads != 0)
        return cfg_fail(err, errlen,
                        "%s: %snum_kv_heads: %d does not divide num_heads %d (each "
                        "key/value head serves num_heads / num_kv_heads query heads).",
                        src, at, hp->num_kv_heads, H);
    int G = attn_hparams_kv_heads(hp);
    if ((G != H || D * H != E) && layout == ATTND_LAYOUT_TORCH)
        return cfg_fail(err, errlen,
                        "%s: %slayout: \"torch\" reads nn.MultiheadAttention's "
                        "tensors, which have num_kv_heads = num_heads and head_dim = "
                        "embed_dim / num_heads; use \"llama\", \"hf_proj\" or a tensors map.",
                        src, at);
    if (hp->rope.dim == -1 && D % 2)
        return cfg_fail(err, errlen,
                        "%s: %srope.dim: %d is odd: left out, it is the head width, and rotary "
                        "positions turn pairs of columns; give an even rope.dim below %d.",
                        src, at, D, D);
    if (hp->rope.dim == -1) hp->rope.dim = D;
    if (hp->rope.dim > D)
        return cfg_fail(err, errlen, "%s: %srope.dim: %d is wider than a head (%d columns).", src,
                        at, hp->rope.dim, D);
    if (hp->rope.dim && (hp->kdim != E || hp->vdim != E))
        return cfg_fail(err, errlen,
                        "%s: %srope: rotary positions need self-attention, so kdim "
                        "and vdim must equal embed_dim (%d, %d, %d).",
                        src, at, hp->kdim, hp->vdim, E);
    if (mc->max_positions && !hp->rope.dim)
        return cfg_fail(err, errlen, "%s: %smax_positions: only a model with rope has positions.",
                        src, at);
    return 0;
}
