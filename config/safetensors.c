/* safetensors.c - reads the header of a .safetensors file: 8 bytes of
 * little-endian header length N, N bytes of JSON mapping tensor names to
 * {dtype, shape, data_offsets}, then the raw little-endian data. Every
 * dtype, shape and offset is checked against the file's real size before
 * any data is touched; the data itself is read by weights.c (with
 * st_read_full and st_to_f32), which also decides which tensors a model
 * needs. Converts F32, F16 and BF16 to float.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "refuse.h"
#include "safetensors.h"

static const struct {
    const char *name;
    unsigned bits; /* per element */
} dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 8},       [ST_U8] = {"U8", 8},           [ST_I8] = {"I8", 8},
    [ST_F8_E5M2] = {"F8_E5M2", 8}, [ST_F8_E4M3] = {"F8_E4M3", 8}, [ST_I16] = {"I16", 16},
    [ST_U16] = {"U16", 16},        [ST_F16] = {"F16", 16},        [ST_BF16] = {"BF16", 16},
    [ST_I32] = {"I32", 32},        [ST_U32] = {"U32", 32},        [ST_F32] = {"F32", 32},
    [ST_F64] = {"F64", 64},        [ST_I64] = {"I64", 64},        [ST_U64] = {"U64", 64},
    [ST_C64] = {"C64", 64},        [ST_F8_E8M0] = {"F8_E8M0", 8}, [ST_F4] = {"F4", 4},
    [ST_F6_E2M3] = {"F6_E2M3", 6}, [ST_F6_E3M2] = {"F6_E3M2", 6},
};

const char *st_dtype_name(st_dtype d) {
    return (unsigned)d < ST_DTYPE_COUNT ? dtypes[d].name : "?";
}

size_t st_dtype_size(st_dtype d) {
    return (unsigned)d < ST_DTYPE_COUNT ? dtypes[d].bits / 8 : 0; /* 0: under a byte */
}

static uint64_t le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    float f;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        f = (float)mant * 0x1p-24f;
        return sign ? -f : f;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (mant << 13); /* Inf or NaN */
    else
        bits = sign | ((exp + 112) << 23) | (mant << 13); /* rebias 15 -> 127 */
    memcpy(&f, &bits, sizeof f);
    return f;
}

float st_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

void st_to_f32(float *dst, const unsigned char *src, st_dtype d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (d == ST_F32) {
            const unsigned char *p = src + 4 * i;
            uint32_t bits =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&dst[i], &bits, sizeof bits);
        } else {
            uint16_t v = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            dst[i] = d == ST_F16 ? st_f16_to_f32(v) : st_bf16_to_f32(v);
        }
    }
}

void st_header_free(st_header *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++)
        free(h->tensors[i].name);
    free(h->tensors);
    for (int i = 0; i < h->n_meta; i++) {
        free(h->meta[i].key);
        free(h->meta[i].value);
    }
    free(h->meta);
    memset(h, 0, sizeof *h);
}

const st_tensor *st_find(const st_header *h, const char *name) {
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->tensors[i].name, name) == 0) return &h->tensors[i];
    return NULL;
}

const st_meta *st_meta_find(const st_header *h, const char *key) {
    for (int i = 0; i < h->n_meta; i++)
        if (strcmp(h->meta[i].key, key) == 0) return &h->meta[i];
    return NULL;
}

/* Keeps "__metadata__" (v): its string values as they are, others as NULL. */
static int parse_meta(st_header *h, json_t *v, const char *file, char *err, size_t errlen) {
    if (!json_is_object(v)) {
        h->n_meta = -1;
        return 0;
    }
    h->meta = calloc(json_object_size(v) + 1, sizeof *h->meta);
    if (!h->meta) return cfg_fail(err, errlen, "%s: out of memory.", file);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        st_meta *m = &h->meta[h->n_meta];
        m->key = strdup(key);
        m->value = json_is_string(val) ? strdup(json_string_value(val)) : NULL;
        if (!m->key || (json_is_string(val) && !m->value)) {
            free(m->key);
            free(m->value);
            return cfg_fail(err, errlen, "%s: out of memory.", file);
        }
        h->n_meta++;
    }
    return 0;
}

/* Reads the header length from the first 8 bytes and checks it against the
 * format's limit and the file's size. */
static int header_length(const unsigned char *b8, uint64_t file_size, const char *file, uint64_t *n,
                         char *err, size_t errlen) {
    if (file_size < 8)
        return cfg_fail(err, errlen,
                        "%s: file is %llu bytes, too short for the 8-byte header length "
                        "(truncated, or not a safetensors file).",
                        file, (unsigned long long)file_size);
    *n = le64(b8);
    if (*n > ST_MAX_HEADER)
        return cfg_fail(
            err, errlen,
            "%s: absurd header length %llu (at most %llu bytes); not a safetensors file.", file,
            (unsigned long long)*n, (unsigned long long)ST_MAX_HEADER);
    if (*n > file_size - 8)
        return cfg_fail(err, errlen,
                        "%s: header length %llu runs past the end of the file (%llu bytes); "
                        "truncated?",
                        file, (unsigned long long)*n, (unsigned long long)file_size);
    return 0;
}

/* A non-negative JSON integer. */
static int get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_entry(st_tensor *t, const char *name, json_t *v, uint64_t data_size,
                       const char *file, char *err, size_t errlen) {
    if (!json_is_object(v))
        return cfg_fail(err, errlen, "%s: tensor \"%s\": header entry is not an object.", file,
                        name);
    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return cfg_fail(err, errlen, "%s: tensor \"%s\": missing or non-string \"dtype\".", file,
                        name);
    int d = 0;
    while (d < ST_DTYPE_COUNT && strcmp(dtypes[d].name, json_string_value(dt)) != 0)
        d++;
    if (d == ST_DTYPE_COUNT)
        return cfg_fail(err, errlen, "%s: tensor \"%s\": unknown dtype \"%.32s\".", file, name,
                        json_string_value(dt));
    t->dtype = (st_dtype)d;
    json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS)
        return cfg_fail(err, errlen,
                        "%s: tensor \"%s\": \"shape\" must be an array of at most %d integers.",
                        file, name, ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (get_u64(json_array_get(shape, (size_t)i), &t->shape[i]) != 0)
            return cfg_fail(err, errlen,
                            "%s: tensor \"%s\": shape[%d] is not a non-negative integer.", file,
                            name, i);
        if (t->shape[i] && t->numel > UINT64_MAX / 8 / t->shape[i])
            return cfg_fail(err, errlen, "%s: tensor \"%s\": shape is absurdly large.", file, name);
        t->numel *= t->shape[i];
    }
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        get_u64(json_array_get(off, 0), &t->begin) != 0 ||
        get_u64(json_array_get(off, 1), &t->end) != 0)
        return cfg_fail(err, errlen,
                        "%s: tensor \"%s\": \"data_offsets\" must be two non-negative integers.",
                        file, name);
    if (t->begin > t->end)
        return cfg_fail(err, errlen, "%s: tensor \"%s\": data_offsets [%llu, %llu] are reversed.",
                        file, name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_size)
        return cfg_fail(err, errlen,
                        "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the end of the file "
                        "(%llu data bytes); truncated?",
                        file, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        (unsigned long long)data_size);
    /* packed sub-byte elements fill whole bytes: numel * bits / 8, rounded up */
    uint64_t need = t->numel / 8 * dtypes[d].bits + (t->numel % 8 * dtypes[d].bits + 7) / 8;
    if (t->end - t->begin != need)
        return cfg_fail(err, errlen,
                        "%s: tensor \"%s\": data_offsets span %llu bytes but %s with %llu elements "
                        "needs %llu.",
                        file, name, (unsigned long long)(t->end - t->begin), dtypes[d].name,
                        (unsigned long long)t->numel, (unsigned long long)need);
    return 0;
}

typedef struct {
    uint64_t begin, end;
    int idx;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx - y->idx;
}

/* Refuses two tensors whose byte ranges share a byte. */
static int check_overlap(const st_header *h, const char *file, char *err, size_t errlen) {
    span *s = malloc((size_t)(h->n ? h->n : 1) * sizeof *s);
    int n = 0, rc = -1;
    if (!s) {
        cfg_fail(err, errlen, "%s: out of memory.", file);
        goto cleanup;
    }
    for (int i = 0; i < h->n; i++)
        if (h->tensors[i].end > h->tensors[i].begin)
            s[n++] = (span){h->tensors[i].begin, h->tensors[i].end, i};
    qsort(s, (size_t)n, sizeof *s, span_cmp);
    for (int i = 1; i < n; i++) {
        if (s[i].begin < s[i - 1].end) {
            cfg_fail(err, errlen, "%s: tensors \"%s\" and \"%s\" overlap (bytes %llu..%llu).", file,
                     h->tensors[s[i - 1].idx].name, h->tensors[s[i].idx].name,
                     (unsigned long long)s[i].begin, (unsigned long long)s[i - 1].end);
            goto cleanup;
        }
    }
    rc = 0;
cleanup:
    free(s);
    return rc;
}

int st_header_parse(st_header *h, const unsigned char *buf, size_t len, uint64_t file_size,
                    const char *file, char *err, size_t errlen) {
    json_t *root = NULL;
    uint64_t n;
    int rc = -1;
    memset(h, 0, sizeof *h);
    if (len < 8 && file_size >= 8) {
        cfg_fail(err, errlen, "%s: header truncated.", file);
        goto cleanup;
    }
    if (header_length(buf, file_size, file, &n, err, errlen) != 0) goto cleanup;
    if (len - 8 < n) {
        cfg_fail(err, errlen, "%s: header truncated (%zu of %llu bytes).", file, len - 8,
                 (unsigned long long)n);
        goto cleanup;
    }
    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        cfg_fail(err, errlen, "%s: header is not valid JSON (column %d): %s.", file, jerr.column,
                 jerr.text);
        goto cleanup;
    }
    if (!json_is_object(root)) {
        cfg_fail(err, errlen, "%s: header is not a JSON object.", file);
        goto cleanup;
    }
    h->data_start = 8 + n;
    h->file_size = file_size;
    h->tensors = calloc(json_object_size(root) + 1, sizeof *h->tensors);
    if (!h->tensors) {
        cfg_fail(err, errlen, "%s: out of memory.", file);
        goto cleanup;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (strcmp(name, "__metadata__") == 0) {
            if (parse_meta(h, v, file, err, errlen) != 0) goto cleanup;
            continue;
        }
        st_tensor *t = &h->tensors[h->n];
        if (parse_entry(t, name, v, file_size - h->data_start, file, err, errlen) != 0)
            goto cleanup;
        t->name = strdup(name);
        if (!t->name) {
            cfg_fail(err, errlen, "%s: out of memory.", file);
            goto cleanup;
        }
        h->n++;
    }
    if (check_overlap(h, file, err, errlen) != 0) goto cleanup;
    rc = 0;
cleanup:
    json_decref(root);
    if (rc != 0) st_header_free(h);
    return rc;
}

int st_read_full(int fd, void *dst, size_t n, uint64_t off) {
    unsigned char *p = dst;
    while (n) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

int st_header_read(st_header *h, int fd, const char *file, char *err, size_t errlen) {
    unsigned char *buf = NULL;
    unsigned char b8[8] = {0};
    struct stat st;
    uint64_t n;
    int rc = -1;
    memset(h, 0, sizeof *h);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        cfg_fail(err, errlen, "%s: not a regular file.", file);
        goto cleanup;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size >= 8 && st_read_full(fd, b8, 8, 0) != 0) {
        cfg_fail(err, errlen, "%s: cannot read: %s.", file, strerror(errno ? errno : EIO));
        goto cleanup;
    }
    if (header_length(b8, size, file, &n, err, errlen) != 0) goto cleanup;
    buf = malloc((size_t)(8 + n));
    if (!buf) {
        cfg_fail(err, errlen, "%s: out of memory for a %llu-byte header.", file,
                 (unsigned long long)n);
        goto cleanup;
    }
    memcpy(buf, b8, 8);
    if (st_read_full(fd, buf + 8, (size_t)n, 8) != 0) {
        cfg_fail(err, errlen, "%s: cannot read the header: %s.", file,
                 strerror(errno ? errno : EIO));
        goto cleanup;
    }
    rc = st_header_parse(h, buf, (size_t)(8 + n), size, file, err, errlen);
cleanup:
    free(buf);
    return rc;
}
