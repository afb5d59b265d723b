/* jsonin.c - the pull reader for request bodies. See jsonin.h. */
#include "jsonin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

static int fail(jin *j, const char *what) {
    snprintf(j->err, sizeof(j->err), "body is not valid JSON: %s at byte %zu", what, jin_offset(j));
    return -1;
}

void jin_init(jin *j, const char *buf, size_t len) {
    j->start = j->p = buf;
    j->end = buf + len;
    j->depth = 0;
    j->err[0] = '\0';
}

size_t jin_offset(const jin *j) {
    return (size_t)(j->p - j->start);
}

int jin_peek(jin *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

int jin_expect(jin *j, char c) {
    if (jin_peek(j) != (unsigned char)c) {
        char what[32];
        snprintf(what, sizeof(what), "expected '%c'", c);
        return fail(j, what);
    }
    j->p++;
    return 0;
}

int jin_next(jin *j, char close) {
    int c = jin_peek(j);
    if (c == ',') {
        j->p++;
        return 0;
    }
    if (c == (unsigned char)close) {
        j->p++;
        return 1;
    }
    char what[32];
    snprintf(what, sizeof(what), "expected ',' or '%c'", close);
    return fail(j, what);
}

static int hex4(const char *s, unsigned *v) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        r <<= 4;
        if (c >= '0' && c <= '9')
            r |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            r |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            r |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *v = r;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes the string at j->p into out (which has room for the raw length,
 * the decoded text is never longer). Returns decoded length or -1. */
static long decode_string(jin *j, char *out, size_t cap, int *cut) {
    if (jin_expect(j, '"') < 0) return -1;
    size_t k = 0;
    for (;;) {
        /* fast path: a run of plain ASCII (base64 text is all of it) */
        const char *run = j->p;
        while (j->p < j->end) {
            unsigned char a = (unsigned char)*j->p;
            if (a < 0x20 || a >= 0x80 || a == '"' || a == '\\') break;
            j->p++;
        }
        if (j->p > run && out) {
            size_t rn = (size_t)(j->p - run);
            if (k + rn < cap) {
                memcpy(out + k, run, rn);
                k += rn;
            } else {
                size_t fit = cap > k + 1 ? cap - k - 1 : 0;
                memcpy(out + k, run, fit);
                k += fit;
                if (cut) *cut = 1;
            }
        }
        if (j->p >= j->end) return fail(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p;
        char tmp[4];
        size_t tn = 0;
        if (c == '"') {
            j->p++;
            break;
        }
        if (c < 0x20) return fail(j, "control character in string");
        if (c == '\\') {
            if (j->end - j->p < 2) return fail(j, "unterminated string");
            char e = j->p[1];
            j->p += 2;
            switch (e) {
            case '"':
                tmp[tn++] = '"';
                break;
            case '\\':
                tmp[tn++] = '\\';
                break;
            case '/':
                tmp[tn++] = '/';
                break;
            case 'b':
                tmp[tn++] = '\b';
                break;
            case 'f':
                tmp[tn++] = '\f';
                break;
            case 'n':
                tmp[tn++] = '\n';
                break;
            case 'r':
                tmp[tn++] = '\r';
                break;
            case 't':
                tmp[tn++] = '\t';
                break;
            case 'u': {
                unsigned cp, lo;
                if (j->end - j->p < 4 || hex4(j->p, &cp) < 0) return fail(j, "bad \\u escape");
                j->p += 4;
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
                        hex4(j->p + 2, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
                        return fail(j, "unpaired surrogate in \\u escape");
                    j->p += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                    return fail(j, "unpaired surrogate in \\u escape");
                }
                if (cp == 0) return fail(j, "\\u0000 in string");
                tn = put_utf8(tmp, cp);
                break;
            }
            default:
                return fail(j, "bad escape in string");
            }
        } else {
            size_t n = utf8_seq_len((const unsigned char *)j->p, (const unsigned char *)j->end);
            if (!n) return fail(j, "invalid UTF-8 in string");
            memcpy(tmp, j->p, n);
            tn = n;
            j->p += n;
        }
        if (out) {
            if (k + tn < cap) {
                memcpy(out + k, tmp, tn);
                k += tn;
            } else if (cut) {
                *cut = 1;
            }
        }
    }
    if (out) out[k] = '\0';
    return (long)k;
}

int jin_string(jin *j, char **out, size_t *len) {
    *out = NULL;
    if (jin_peek(j) != '"') return fail(j, "expected a string");
    /* the raw length bounds the decoded one */
    const char *q = j->p + 1;
    while (q < j->end && *q != '"')
        q += (*q == '\\' && q + 1 < j->end) ? 2 : 1;
    size_t raw = (size_t)(q - j->p);
    char *buf = malloc(raw + 1);
    if (!buf) return fail(j, "out of memory");
    long n = decode_string(j, buf, raw + 1, NULL);
    if (n < 0) {
        free(buf);
        return -1;
    }
    *out = buf;
    if (len) *len = (size_t)n;
    return 0;
}

int jin_string_span(jin *j, const char **s, size_t *n) {
    if (jin_peek(j) != '"') return fail(j, "expected a string");
    const char *start = j->p + 1;
    const char *q = memchr(start, '"', (size_t)(j->end - start));
    if (!q) return fail(j, "unterminated string");
    if (memchr(start, '\\', (size_t)(q - start))) return 1;
    *s = start;
    *n = (size_t)(q - start);
    j->p = q + 1;
    return 0;
}

int jin_string_buf(jin *j, char *buf, size_t cap, int *cut) {
    if (cut) *cut = 0;
    int dummy = 0;
    return decode_string(j, buf, cap, cut ? cut : &dummy) < 0 ? -1 : 0;
}

static int number_start(jin *j) {
    int c = jin_peek(j);
    if (c != '-' && (c < '0' || c > '9')) return fail(j, "expected a number");
    return 0;
}

int jin_number(jin *j, double *v) {
    if (number_start(j) < 0) return -1;
    size_t n = parse_number(j->p, (size_t)(j->end - j->p), v);
    if (!n) return fail(j, "bad number");
    j->p += n;
    return 0;
}

int jin_f32(jin *j, float *v) {
    if (number_start(j) < 0) return -1;
    size_t n = parse_f32(j->p, (size_t)(j->end - j->p), v);
    if (!n) return fail(j, "bad number");
    j->p += n;
    return 0;
}

static int literal(jin *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return -1;
    j->p += n;
    return 0;
}

int jin_bool(jin *j, int *v) {
    int c = jin_peek(j);
    if (c == 't' && literal(j, "true") == 0) {
        *v = 1;
        return 0;
    }
    if (c == 'f' && literal(j, "false") == 0) {
        *v = 0;
        return 0;
    }
    return fail(j, "expected true or false");
}

int jin_null(jin *j) {
    if (jin_peek(j) == 'n' && literal(j, "null") == 0) return 0;
    return fail(j, "expected null");
}

int jin_skip(jin *j) {
    int c = jin_peek(j);
    double d;
    switch (c) {
    case '"':
        return decode_string(j, NULL, 0, NULL) < 0 ? -1 : 0;
    case 't':
    case 'f': {
        int b;
        return jin_bool(j, &b);
    }
    case 'n':
        return jin_null(j);
    case '[':
    case '{': {
        char close = c == '[' ? ']' : '}';
        if (++j->depth > JIN_MAX_DEPTH) return fail(j, "nested too deep");
        j->p++;
        if (jin_peek(j) == close) {
            j->p++;
            j->depth--;
            return 0;
        }
        for (;;) {
            if (close == '}') {
                if (decode_string(j, NULL, 0, NULL) < 0) return -1;
                if (jin_expect(j, ':') < 0) return -1;
            }
            if (jin_skip(j) < 0) return -1;
            int r = jin_next(j, close);
            if (r < 0) return -1;
            if (r == 1) break;
        }
        j->depth--;
        return 0;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return jin_number(j, &d);
        return fail(j, c < 0 ? "unexpected end" : "unexpected character");
    }
}

int jin_end(jin *j) {
    if (jin_peek(j) != -1) return fail(j, "trailing characters");
    return 0;
}

const char *jin_kind(jin *j) {
    int c = jin_peek(j);
    switch (c) {
    case '"':
        return "a string";
    case '[':
        return "an array";
    case '{':
        return "an object";
    case 't':
    case 'f':
        return "a boolean";
    case 'n':
        return "null";
    case -1:
        return "nothing";
    default:
        return (c == '-' || (c >= '0' && c <= '9')) ? "a number" : "an invalid token";
    }
}
