/* state.c - the session state file: a safetensors file of one session's
 * keys, values and positions (state.h says what it holds). The writer
 * lays the header out with Jansson, padded with spaces to 8 bytes as the
 * format recommends, then the three tensors back to back; the reader lets
 * config/safetensors.c check the header (length, JSON, dtypes, shapes,
 * offsets, overlaps) and checks the rest here: metadata, names, dtypes
 * against the precision, shapes against each other and the length, every
 * data byte used, positions, finite values.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/refuse.h"
#include "../../config/safetensors.h"
#include "../../config/weights.h"
#include "state.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "state.c writes the cache's floats as they lie in memory: little-endian hosts only"
#endif

#define FILE_NAME "session state"
#define FP_MAX 128 /* bytes of a fingerprint string */

static const char *const precision_names[] = {
    [ATTND_STATE_FP32] = "fp32", [ATTND_STATE_BF16] = "bf16", [2] = "int8"};

static st_dtype cache_dtype(attnd_state_precision p) {
    return p == ATTND_STATE_BF16 ? ST_BF16 : ST_F32;
}

void attnd_state_free(attnd_state *st) {
    if (!st) return;
    free(st->model);
    free(st->fingerprint);
    free(st->kv);
    free(st->positions);
    memset(st, 0, sizeof *st);
}

/* ---- writing ---------------------------------------------------------------- */

static int write_args_ok(const attnd_state *st, char *err, size_t errlen) {
    size_t name = st->model ? strlen(st->model) : 0;
    size_t fp = st->fingerprint ? strlen(st->fingerprint) : 0;
    if (name == 0 || name >= ATTND_NAME_MAX)
        return cfg_fail(err, errlen, "session state: model name of %zu bytes (1 to %d).", name,
                        ATTND_NAME_MAX - 1);
    if (fp == 0 || fp > FP_MAX)
        return cfg_fail(err, errlen, "session state: fingerprint of %zu bytes (1 to %d).", fp,
                        FP_MAX);
    if ((unsigned)st->precision > ATTND_STATE_BF16)
        return cfg_fail(err, errlen, "session state: unknown precision %d.", (int)st->precision);
    if (st->len < 0 || (st->len > 0 && !st->kv))
        return cfg_fail(err, errlen, "session state: length %d without its cache.", st->len);
    if (st->G < 1 || st->G > ATTND_STATE_MAX_HEADS || st->D < 1 || st->D > ATTND_STATE_MAX_HEADS)
        return cfg_fail(err, errlen, "session state: G %d and D %d must be 1 to %d.", st->G, st->D,
                        ATTND_STATE_MAX_HEADS);
    return 0;
}

/* {"dtype": d, "shape": [...], "data_offsets": [begin, end]}; NULL when out of memory. */
static json_t *tensor_json(st_dtype d, const st_tensor *shape, uint64_t begin, uint64_t end) {
    json_t *dims = json_array();
    for (int i = 0; dims && i < shape->ndim; i++)
        json_array_append_new(dims, json_integer((json_int_t)shape->shape[i]));
    return json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtype_name(d), "shape", dims,
                     "data_offsets", (json_int_t)begin, (json_int_t)end);
}

/* The header's JSON text, compact; caller frees. NULL with err filled. */
static char *header_text(const attnd_state *st, uint64_t half, char *err, size_t errlen) {
    char length[16];
    char *text = NULL;
    snprintf(length, sizeof length, "%d", st->len);
    st_tensor kshape = {.ndim = 3, .shape = {(uint64_t)st->len, (uint64_t)st->G, (uint64_t)st->D}};
    st_tensor pshape = {.ndim = 1, .shape = {(uint64_t)st->len}};
    uint64_t pos_end = 2 * half + 4 * (uint64_t)st->len;
    json_t *meta =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "format", ATTND_STATE_FORMAT, "format_version",
                  ATTND_STATE_VERSION, "model", st->model, "fingerprint", st->fingerprint, "length",
                  length, "precision", st->int8 ? "int8" : precision_names[st->precision]);
    json_t *root = json_pack("{s:o, s:o, s:o, s:o}", "__metadata__", meta, "keys",
                             tensor_json(cache_dtype(st->precision), &kshape, 0, half), "values",
                             tensor_json(cache_dtype(st->precision), &kshape, half, 2 * half),
                             "positions", tensor_json(ST_I32, &pshape, 2 * half, pos_end));
    if (meta && root) text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text)
        cfg_fail(err, errlen,
                 "session state: cannot write the header (model name or fingerprint not UTF-8, "
                 "or out of memory).");
    json_decref(root);
    return text;
}

int attnd_state_write(attnd_sbuf *out, const attnd_state *st, char *err, size_t errlen) {
    char *text = NULL;
    int rc = -1;
    if (write_args_ok(st, err, errlen) != 0) goto cleanup;
    size_t es = st_dtype_size(cache_dtype(st->precision));
    size_t row = (size_t)st->G * (size_t)st->D * es; /* bytes of one token's key or value */
    if (st->len && row > (SIZE_MAX / 4) / (size_t)st->len) {
        cfg_fail(err, errlen, "session state: %d tokens of %zu bytes are too many.", st->len, row);
        goto cleanup;
    }
    uint64_t half = (uint64_t)row * (uint64_t)st->len;
    text = header_text(st, half, err, errlen);
    if (!text) goto cleanup;
    size_t hlen = strlen(text), padded = (hlen + 7) / 8 * 8;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    attnd_sb_reserve(out, 8 + padded + 2 * (size_t)half + 4 * (size_t)st->len);
    attnd_sb_put(out, le, 8);
    attnd_sb_put(out, text, hlen);
    for (size_t i = hlen; i < padded; i++)
        attnd_sb_putc(out, ' ');
    const unsigned char *kv = st->kv;
    for (int part = 0; part < 2; part++) /* keys, then values */
        for (int t = 0; t < st->len; t++)
            attnd_sb_put(out, kv + ((size_t)t * 2 + (size_t)part) * row, row);
    for (int t = 0; t < st->len; t++) {
        int32_t p = st->positions ? st->positions[t] : t;
        attnd_sb_put(out, &p, 4);
    }
    rc = 0;
cleanup:
    free(text);
    return rc;
}

/* ---- reading ---------------------------------------------------------------- */

/* The value of a metadata key that must be there. */
static const char *meta_need(const st_header *h, const char *key, char *err, size_t errlen) {
    const st_meta *m = st_meta_find(h, key);
    if (!m) cfg_fail(err, errlen, FILE_NAME ": __metadata__ has no \"%s\".", key);
    return m ? m->value : NULL; /* values are strings: read_meta checked every one */
}

/* "length": a plain decimal, no sign, no leading zero, at most max. */
static int parse_length(const char *s, int max, int *out, char *err, size_t errlen) {
    long long v = 0;
    size_t n = strlen(s);
    int ok = n > 0 && n <= 10 && !(n > 1 && s[0] == '0');
    for (size_t i = 0; ok && i < n; i++) {
        ok = s[i] >= '0' && s[i] <= '9';
        v = v * 10 + (s[i] - '0');
    }
    if (!ok)
        return cfg_fail(err, errlen,
                        FILE_NAME ": __metadata__ \"length\" is \"%.20s\", not a whole number.", s);
    if (v > max)
        return cfg_fail(err, errlen, FILE_NAME ": length %lld is over the limit of %d tokens.", v,
                        max);
    *out = (int)v;
    return 0;
}

static int read_meta(const st_header *h, const attnd_state_limits *lim, attnd_state *st, char *err,
                     size_t errlen) {
    if (h->n_meta < 0) return cfg_fail(err, errlen, FILE_NAME ": __metadata__ is not an object.");
    for (int i = 0; i < h->n_meta; i++)
        if (!h->meta[i].value)
            return cfg_fail(err, errlen,
                            FILE_NAME ": __metadata__ \"%.64s\" is not a string (the format's "
                                      "metadata values are strings).",
                            h->meta[i].key);
    const char *format = meta_need(h, "format", err, errlen);
    const char *version = format ? meta_need(h, "format_version", err, errlen) : NULL;
    const char *model = version ? meta_need(h, "model", err, errlen) : NULL;
    const char *fp = model ? meta_need(h, "fingerprint", err, errlen) : NULL;
    const char *length = fp ? meta_need(h, "length", err, errlen) : NULL;
    const char *prec = length ? meta_need(h, "precision", err, errlen) : NULL;
    if (!prec) return -1;
    if (strcmp(format, ATTND_STATE_FORMAT) != 0)
        return cfg_fail(err, errlen, FILE_NAME ": format is \"%.40s\", not \"%s\".", format,
                        ATTND_STATE_FORMAT);
    if (strcmp(version, ATTND_STATE_VERSION) != 0)
        return cfg_fail(err, errlen, FILE_NAME ": format_version \"%.20s\" is not %s.", version,
                        ATTND_STATE_VERSION);
    if (strlen(model) == 0 || strlen(model) >= ATTND_NAME_MAX)
        return cfg_fail(err, errlen, FILE_NAME ": model name of %zu bytes (1 to %d).",
                        strlen(model), ATTND_NAME_MAX - 1);
    if (strlen(fp) == 0 || strlen(fp) > FP_MAX)
        return cfg_fail(err, errlen, FILE_NAME ": fingerprint of %zu bytes (1 to %d).", strlen(fp),
                        FP_MAX);
    int p = cfg_name_index(prec, precision_names, 3);
    if (p < 0)
        return cfg_fail(err, errlen, FILE_NAME ": precision \"%.20s\" is not fp32, bf16 or int8.",
                        prec);
    /* int8: the cache as the model holds it, bf16 or floats, which its keys say */
    const st_tensor *keys = st_find(h, "keys");
    st->int8 = p == 2;
    st->precision = p == 2 ? (keys && keys->dtype == ST_BF16 ? ATTND_STATE_BF16 : ATTND_STATE_FP32)
                           : (attnd_state_precision)p;
    if (parse_length(length, lim->max_tokens, &st->len, err, errlen) != 0) return -1;
    st->model = strdup(model);
    st->fingerprint = strdup(fp);
    if (!st->model || !st->fingerprint) return cfg_fail(err, errlen, FILE_NAME ": out of memory.");
    return 0;
}

/* A tensor that must be there with this dtype and rank. */
static const st_tensor *tensor_need(const st_header *h, const char *name, st_dtype d, int ndim,
                                    const char *why, char *err, size_t errlen) {
    const st_tensor *t = st_find(h, name);
    if (!t)
        cfg_fail(err, errlen, FILE_NAME ": no tensor \"%s\".", name);
    else if (t->dtype != d)
        cfg_fail(err, errlen, FILE_NAME ": tensor \"%s\" is %s, but %s is %s.", name,
                 st_dtype_name(t->dtype), why, st_dtype_name(d));
    else if (t->ndim != ndim)
        cfg_fail(err, errlen, FILE_NAME ": tensor \"%s\" has %d dimensions, not %d.", name, t->ndim,
                 ndim);
    else
        return t;
    return NULL;
}

static int check_tensors(const st_header *h, uint64_t data_size, attnd_state *st, char *err,
                         size_t errlen) {
    static const char *const names[] = {"keys", "values", "positions"};
    uint64_t used = 0;
    for (int i = 0; i < h->n; i++) {
        if (cfg_name_index(h->tensors[i].name, names, 3) < 0)
            return cfg_fail(err, errlen, FILE_NAME ": unknown tensor \"%.64s\".",
                            h->tensors[i].name);
        used += h->tensors[i].end - h->tensors[i].begin;
    }
    const char *why = st->int8                            ? "an int8 model's cache"
                      : st->precision == ATTND_STATE_BF16 ? "precision bf16"
                                                          : "precision fp32";
    st_dtype d = cache_dtype(st->precision);
    const st_tensor *k = tensor_need(h, "keys", d, 3, why, err, errlen);
    const st_tensor *v = k ? tensor_need(h, "values", d, 3, why, err, errlen) : NULL;
    const st_tensor *p =
        v ? tensor_need(h, "positions", ST_I32, 1, "a position", err, errlen) : NULL;
    if (!p) return -1;
    if (memcmp(k->shape, v->shape, sizeof k->shape) != 0)
        return cfg_fail(err, errlen, FILE_NAME ": keys (%llu, %llu, %llu) and values differ.",
                        (unsigned long long)k->shape[0], (unsigned long long)k->shape[1],
                        (unsigned long long)k->shape[2]);
    if (k->shape[0] != (uint64_t)st->len || p->shape[0] != (uint64_t)st->len)
        return cfg_fail(err, errlen,
                        FILE_NAME ": keys hold %llu tokens and positions %llu, but length is %d.",
                        (unsigned long long)k->shape[0], (unsigned long long)p->shape[0], st->len);
    if (k->shape[1] < 1 || k->shape[1] > ATTND_STATE_MAX_HEADS || k->shape[2] < 1 ||
        k->shape[2] > ATTND_STATE_MAX_HEADS)
        return cfg_fail(err, errlen, FILE_NAME ": keys' heads %llu and width %llu must be 1 to %d.",
                        (unsigned long long)k->shape[1], (unsigned long long)k->shape[2],
                        ATTND_STATE_MAX_HEADS);
    if (used != data_size)
        return cfg_fail(err, errlen,
                        FILE_NAME ": %llu data bytes, of which the tensors use %llu; the format "
                                  "leaves no bytes unused.",
                        (unsigned long long)data_size, (unsigned long long)used);
    st->G = (int)k->shape[1];
    st->D = (int)k->shape[2];
    return 0;
}

/* Copies one tensor's rows into every other half-row of the cache,
 * refusing NaN and Inf. */
static int copy_half(const unsigned char *src, unsigned char *kv, const attnd_state *st, int part,
                     char *err, size_t errlen) {
    size_t gd = (size_t)st->G * (size_t)st->D, es = st->precision == ATTND_STATE_BF16 ? 2 : 4;
    for (int t = 0; t < st->len; t++) {
        const unsigned char *s = src + (size_t)t * gd * es;
        unsigned char *dst = kv + ((size_t)t * 2 + (size_t)part) * gd * es;
        for (size_t i = 0; i < gd; i++) {
            uint32_t bits = es == 2
                                ? (uint32_t)(s[2 * i] | s[2 * i + 1] << 8) << 16
                                : (uint32_t)s[4 * i] | (uint32_t)s[4 * i + 1] << 8 |
                                      (uint32_t)s[4 * i + 2] << 16 | (uint32_t)s[4 * i + 3] << 24;
            if ((bits & 0x7f800000u) == 0x7f800000u)
                return cfg_fail(err, errlen, FILE_NAME ": %s[%d][%zu][%zu] is %s.",
                                part ? "values" : "keys", t, i / (size_t)st->D, i % (size_t)st->D,
                                bits & 0x007fffffu ? "NaN" : "Inf");
        }
        memcpy(dst, s, gd * es);
    }
    return 0;
}

static int read_data(const st_header *h, const unsigned char *bytes, attnd_state *st, char *err,
                     size_t errlen) {
    const unsigned char *data = bytes + h->data_start;
    const st_tensor *p = st_find(h, "positions");
    for (int t = 0; t < st->len; t++) {
        const unsigned char *b = data + p->begin + 4 * (size_t)t;
        int32_t v = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                              (uint32_t)b[3] << 24);
        if (v != t)
            return cfg_fail(err, errlen,
                            FILE_NAME ": positions[%d] is %d, not %d (a session's tokens sit at "
                                      "positions 0..length-1).",
                            t, v, t);
    }
    if (st->len == 0) return 0;
    size_t es = st->precision == ATTND_STATE_BF16 ? 2 : 4;
    size_t bytes_kv = (size_t)st->len * 2 * (size_t)st->G * (size_t)st->D * es;
    st->kv = malloc(bytes_kv);
    st->positions = malloc((size_t)st->len * sizeof *st->positions);
    if (!st->kv || !st->positions) return cfg_fail(err, errlen, FILE_NAME ": out of memory.");
    for (int t = 0; t < st->len; t++)
        st->positions[t] = t;
    if (copy_half(data + st_find(h, "keys")->begin, st->kv, st, 0, err, errlen) != 0) return -1;
    return copy_half(data + st_find(h, "values")->begin, st->kv, st, 1, err, errlen);
}

int attnd_state_read(const unsigned char *bytes, size_t n, const attnd_state_limits *lim,
                     attnd_state *st, char *err, size_t errlen) {
    st_header h;
    int rc = -1;
    memset(st, 0, sizeof *st);
    memset(&h, 0, sizeof h);
    if (n > lim->max_bytes) {
        cfg_fail(err, errlen, FILE_NAME ": %zu bytes, over the limit of %zu.", n, lim->max_bytes);
        goto cleanup;
    }
    if (st_header_parse(&h, bytes, n, n, FILE_NAME, err, errlen) != 0) goto cleanup;
    if (read_meta(&h, lim, st, err, errlen) != 0) goto cleanup;
    if (check_tensors(&h, n - h.data_start, st, err, errlen) != 0) goto cleanup;
    if (read_data(&h, bytes, st, err, errlen) != 0) goto cleanup;
    rc = 0;
cleanup:
    st_header_free(&h);
    if (rc != 0) attnd_state_free(st);
    return rc;
}

/* ---- the weights' fingerprint ----------------------------------------------- */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

static uint64_t fnv1a_i64(uint64_t h, int64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)v >> (8 * i));
    return fnv1a(h, b, 8);
}

static uint64_t fnv1a_f64(uint64_t h, double d) {
    int64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return fnv1a_i64(h, bits);
}

void attnd_weights_fingerprint(const attn_model *m, char out[ATTND_FINGERPRINT_LEN + 1]) {
    const attn_hparams *hp = &m->hp;
    const int64_t ints[] = {hp->embed_dim,
                            hp->num_heads,
                            hp->kdim,
                            hp->vdim,
                            hp->bias,
                            hp->num_kv_heads,
                            hp->head_dim,
                            hp->rope.dim,
                            (int64_t)hp->rope.style,
                            hp->rope.scaling,
                            hp->rope.original_max_position};
    const double reals[] = {hp->scale, hp->rope.theta, hp->rope.factor, hp->rope.low_freq_factor,
                            hp->rope.high_freq_factor};
    uint64_t h = FNV_OFFSET;
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        h = fnv1a_i64(h, ints[i]);
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
        h = fnv1a_f64(h, reals[i]);
    const attn_rope *r = &hp->rope;
    const double yarn[] = {r->beta_fast,      r->beta_slow,        r->mscale,
                           r->mscale_all_dim, r->attention_factor, r->exact_range};
    for (size_t i = 0; r->scaling == ATTN_ROPE_SCALE_YARN && i < sizeof yarn / sizeof *yarn; i++)
        h = fnv1a_f64(h, yarn[i]); /* only YaRN's: the other models' fingerprints stay */
    const void *blocks[5];
    size_t bytes[5];
    int nb = attn_model_weight_blocks(m, blocks, bytes); /* a bf16 model's bf16 weights too */
    for (int i = 0; i < nb; i++)
        h = fnv1a(h, blocks[i], bytes[i]);
    snprintf(out, ATTND_FINGERPRINT_LEN + 1, "fnv1a64:%016llx", (unsigned long long)h);
}
