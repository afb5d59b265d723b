/* fuzz_json.c - libFuzzer target, differential: the bytes are any JSON
 * text. attnd's pull reader (server/codec/jsonin.c) must accept exactly the
 * documents Jansson's json_loadb accepts and read the same values: the
 * same strings byte for byte, numbers as the same double, the same keys
 * (the last of a duplicate, as Jansson keeps); and every number read as a
 * float32 is the float strtof gives. Three known differences are
 * allowed and checked for what they are: Jansson refuses integers past 64
 * bits and numbers past the double range (json_error_numeric_overflow),
 * which attnd reads; attnd refuses nesting deeper than JIN_MAX_DEPTH; and
 * Jansson skips one NUL byte right after a number or a literal ("[1\0]",
 * "true\0"), which is not JSON and attnd refuses: attnd must then read the
 * text without those bytes as Jansson read it with them.
 *   make fuzz-smoke; make fuzz-long
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/codec/floattext.h"
#include "../../server/codec/jsonin.h"

#include "fuzz_check.h"

/* The float32 reader on the same number text gives what strtof gives. */
static void check_f32(const char *s, size_t n) {
    char buf[4200];
    if (n >= sizeof(buf)) return;
    memcpy(buf, s, n);
    buf[n] = '\0';
    float v = 0, ref = strtof(buf, NULL);
    FUZZ_CHECK(attnd_parse_f32(s, n, &v) == n);
    if (memcmp(&v, &ref, 4) != 0)
        fprintf(stderr, "%s: attnd_parse_f32 %.9g, strtof %.9g\n", buf, (double)v, (double)ref);
    FUZZ_CHECK(memcmp(&v, &ref, 4) == 0);
}

/* Reads one value with the pull reader into a Jansson tree (numbers as
 * reals). NULL on a syntax error. */
static json_t *read_value(jin *j) {
    int c = attnd_jin_peek(j);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        int r = attnd_jin_open(j, (char)c); /* the reader counts the depth */
        if (r < 0) return NULL;
        json_t *v = c == '{' ? json_object() : json_array();
        if (r == 1) return v;
        for (;;) {
            char *key = NULL;
            size_t klen = 0;
            if (close == '}' &&
                (attnd_jin_string(j, &key, &klen) < 0 || attnd_jin_expect(j, ':') < 0)) {
                free(key);
                json_decref(v);
                return NULL;
            }
            json_t *e = read_value(j);
            if (!e) {
                free(key);
                json_decref(v);
                return NULL;
            }
            if (key)
                json_object_setn_new_nocheck(v, key, klen, e);
            else
                json_array_append_new(v, e);
            free(key);
            int r = attnd_jin_next(j, close);
            if (r < 0) {
                json_decref(v);
                return NULL;
            }
            if (r == 1) return v;
        }
    }
    if (c == '"') {
        char *s = NULL;
        size_t n = 0;
        if (attnd_jin_string(j, &s, &n) < 0) return NULL;
        json_t *v = json_stringn_nocheck(s, n);
        free(s);
        return v;
    }
    if (c == 't' || c == 'f') {
        int b;
        return attnd_jin_bool(j, &b) < 0 ? NULL : json_boolean(b);
    }
    if (c == 'n') return attnd_jin_null(j) < 0 ? NULL : json_null();
    double d;
    size_t at = attnd_jin_offset(j);
    if (attnd_jin_number(j, &d) < 0) return NULL;
    check_f32(attnd_jin_body(j) + at, attnd_jin_offset(j) - at);
    /* Jansson holds no infinity (it refuses such numbers as overflow) */
    return isinf(d) ? json_string(d > 0 ? "+inf" : "-inf") : json_real(d);
}

static int same(const json_t *a, const json_t *b) {
    if (json_is_number(a) || json_is_number(b)) {
        if (!json_is_number(a) || !json_is_number(b)) return 0;
        double x = json_number_value(a), y = json_number_value(b);
        return x == y || (isinf(x) && isinf(y) && (x > 0) == (y > 0));
    }
    if (json_typeof(a) != json_typeof(b)) return 0;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) return 0;
        const char *k;
        size_t klen;
        json_t *v;
        json_object_keylen_foreach((json_t *)a, k, klen, v) {
            json_t *w = json_object_getn(b, k, klen);
            if (!w || !same(v, w)) return 0;
        }
        return 1;
    }
    default:
        return 1;
    }
}

/* Deepest nesting of the text, counting brackets outside strings. */
static int depth_of(const uint8_t *s, size_t n) {
    int d = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            if (s[i] == '\\')
                i++;
            else if (s[i] == '"')
                in_str = 0;
        } else if (s[i] == '"') {
            in_str = 1;
        } else if (s[i] == '[' || s[i] == '{') {
            if (++d > max) max = d;
        } else if (s[i] == ']' || s[i] == '}') {
            d--;
        }
    }
    return max;
}

/* The text without each NUL byte that follows a number or a literal
 * outside strings, read by attnd: 1 when that reads as ref. */
static int read_without_skipped_nuls(const uint8_t *s, size_t n, const json_t *ref) {
    char *t = malloc(n ? n : 1);
    size_t k = 0;
    int in_str = 0, cut = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            if (s[i] == '\\' && i + 1 < n)
                t[k++] = (char)s[i++];
            else if (s[i] == '"')
                in_str = 0;
        } else if (s[i] == '"') {
            in_str = 1;
        } else if (s[i] == 0 && k && strchr("0123456789eluE", t[k - 1])) {
            cut = 1;
            continue;
        }
        t[k++] = (char)s[i];
    }
    int ok = 0;
    if (cut) {
        jin *j = attnd_jin_new(t, k);
        json_t *mine = read_value(j);
        ok = mine && attnd_jin_end(j) == 0 && same(ref, mine);
        json_decref(mine);
        attnd_jin_free(j);
    }
    free(t);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t err;
    json_t *ref = json_loadb((const char *)data, size, JSON_DECODE_ANY, &err);
    jin *j = attnd_jin_new((const char *)data, size);
    json_t *mine = read_value(j);
    if (mine && attnd_jin_end(j) < 0) {
        json_decref(mine);
        mine = NULL;
    }
    if (ref && mine) {
        if (!same(ref, mine)) {
            char *a = json_dumps(ref, JSON_ENCODE_ANY), *b = json_dumps(mine, JSON_ENCODE_ANY);
            fprintf(stderr, "different values:\n jansson: %.300s\n attnd:   %.300s\n", a, b);
            abort();
        }
    } else if (ref) {
        int deep = depth_of(data, size) > JIN_MAX_DEPTH;
        if (!deep && !read_without_skipped_nuls(data, size, ref))
            fprintf(stderr, "attnd refuses what jansson reads: %s\n", attnd_jin_error(j));
        FUZZ_CHECK(deep || read_without_skipped_nuls(data, size, ref));
    } else if (mine) {
        if (json_error_code(&err) != json_error_numeric_overflow)
            fprintf(stderr, "attnd reads what jansson refuses: %s at %d\n", err.text, err.position);
        FUZZ_CHECK(json_error_code(&err) == json_error_numeric_overflow);
    } else {
        FUZZ_CHECK(attnd_jin_error(j)[0] != '\0');
    }
    json_decref(ref);
    json_decref(mine);
    attnd_jin_free(j);
    return 0;
}
