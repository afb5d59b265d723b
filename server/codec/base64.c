/* base64.c - standard base64 (RFC 4648 section 4) both ways, two
 * characters per table lookup (see base64.h); text wrapped in lines is read
 * too, slowly, and what is wrong with text that is not base64 is said in
 * words. Pure and thread-safe; the tables are built once. */
#include "base64.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Tables built once: ENC2[v] is the two characters of the 12-bit value v;
 * DEC2[c1 << 8 | c2] is the 12-bit value of a character pair, or 0xffff. */
static uint16_t ENC2[4096];
static uint16_t DEC2[65536];
static pthread_once_t b64_once = PTHREAD_ONCE_INIT;

static void b64_tables(void) {
    unsigned char v[256];
    memset(v, 64, sizeof(v));
    for (int i = 0; i < 64; i++)
        v[(unsigned char)B64[i]] = (unsigned char)i;
    for (int i = 0; i < 4096; i++) {
        unsigned char two[2] = {(unsigned char)B64[i >> 6], (unsigned char)B64[i & 63]};
        memcpy(&ENC2[i], two, 2);
    }
    for (int a = 0; a < 256; a++)
        for (int c = 0; c < 256; c++) {
            unsigned char two[2] = {(unsigned char)a, (unsigned char)c};
            uint16_t key;
            memcpy(&key, two, 2);
            DEC2[key] = (v[a] | v[c]) & 64 ? 0xffff : (uint16_t)(v[a] << 6 | v[c]);
        }
}

size_t attnd_b64_encode(char *dst, const void *data, size_t n) {
    const unsigned char *p = data;
    pthread_once(&b64_once, b64_tables);
    char *o = dst;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        memcpy(o, &ENC2[v >> 12], 2);
        memcpy(o + 2, &ENC2[v & 4095], 2);
        o += 4;
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        o[0] = B64[v >> 18];
        o[1] = B64[(v >> 12) & 63];
        o[2] = o[3] = '=';
        o += 4;
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        o[0] = B64[v >> 18];
        o[1] = B64[(v >> 12) & 63];
        o[2] = B64[(v >> 6) & 63];
        o[3] = '=';
        o += 4;
    }
    return (size_t)(o - dst);
}

void attnd_sb_b64(attnd_sbuf *b, const void *data, size_t n) {
    if (attnd_sb_reserve(b, (n + 2) / 3 * 4) < 0) return;
    b->len += attnd_b64_encode(b->p + b->len, data, n);
    b->p[b->len] = '\0';
}

size_t attnd_b64_decoded_max(size_t n) {
    return n / 4 * 3 + 3;
}

/* Four characters at a time; -1 on anything that is not plain base64. */
static int decode_fast(const char *s, size_t n, void *out, size_t cap, size_t *outlen) {
    unsigned char *o = out;
    if (n % 4 == 0 && n >= 1 && s[n - 1] == '=') n--;
    if (n % 4 == 3 && n >= 1 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    size_t need = n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0);
    if (need > cap) return -1;
    size_t i = 0, k = 0;
    for (; i + 4 <= n; i += 4) {
        uint16_t k1, k2;
        memcpy(&k1, s + i, 2);
        memcpy(&k2, s + i + 2, 2);
        uint32_t hi = DEC2[k1], lo = DEC2[k2];
        if (hi == 0xffff || lo == 0xffff) return -1;
        uint32_t v = hi << 12 | lo;
        o[k++] = (unsigned char)(v >> 16);
        o[k++] = (unsigned char)(v >> 8);
        o[k++] = (unsigned char)v;
    }
    size_t rest = n - i;
    if (rest) {
        char tail[4] = {s[i], s[i + 1], rest == 3 ? s[i + 2] : 'A', 'A'};
        uint16_t k1, k2;
        memcpy(&k1, tail, 2);
        memcpy(&k2, tail + 2, 2);
        uint32_t hi = DEC2[k1], lo = DEC2[k2];
        if (hi == 0xffff || lo == 0xffff) return -1;
        uint32_t v = hi << 12 | lo;
        o[k++] = (unsigned char)(v >> 16);
        if (rest == 3) o[k++] = (unsigned char)(v >> 8);
    }
    *outlen = k;
    return 0;
}

/* The 6-bit value of c, or -1. */
static int b64_value(unsigned char c) {
    const char *p = c ? strchr(B64, c) : NULL;
    return p ? (int)(p - B64) : -1;
}

static int is_break(char c) {
    return c == '\n' || c == '\r';
}

/* One character at a time, skipping line breaks: wrapped text (MIME,
 * base64.encodebytes, the base64 tool) is rare enough to go slowly. */
static int decode_lines(const char *s, size_t n, void *out, size_t cap, size_t *outlen) {
    unsigned char *o = out;
    uint32_t acc = 0;
    size_t chars = 0, k = 0, pads = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_break(s[i])) continue;
        if (s[i] == '=') {
            pads++;
            continue;
        }
        int v = b64_value((unsigned char)s[i]);
        if (v < 0 || pads) return -1;
        acc = acc << 6 | (uint32_t)v;
        if (++chars % 4 == 0) {
            if (k + 3 > cap) return -1;
            o[k++] = (unsigned char)(acc >> 16);
            o[k++] = (unsigned char)(acc >> 8);
            o[k++] = (unsigned char)acc;
        }
    }
    size_t rest = chars % 4;
    if (rest == 1 || (pads && (rest == 0 || pads > 4 - rest))) return -1; /* as decode_fast */
    if (rest) {
        acc <<= 6 * (4 - rest);
        if (k + rest - 1 > cap) return -1;
        o[k++] = (unsigned char)(acc >> 16);
        if (rest == 3) o[k++] = (unsigned char)(acc >> 8);
    }
    *outlen = k;
    return 0;
}

int attnd_b64_decode(const char *s, size_t n, void *out, size_t cap, size_t *outlen,
                     int breaks_ok) {
    pthread_once(&b64_once, b64_tables);
    if (decode_fast(s, n, out, cap, outlen) == 0) return 0;
    if (breaks_ok && (memchr(s, '\n', n) || memchr(s, '\r', n)))
        return decode_lines(s, n, out, cap, outlen);
    return -1;
}

void attnd_b64_explain(const char *s, size_t n, int breaks_ok, char *buf, size_t cap) {
    size_t chars = 0, pads = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (breaks_ok && is_break((char)c)) continue;
        if (c == '=') {
            pads++;
            continue;
        }
        if (pads) {
            snprintf(buf, cap, "'=' padding before the end (character %zu)", i - pads);
            return;
        }
        if (b64_value(c) >= 0) {
            chars++;
            continue;
        }
        if (c == '-' || c == '_')
            snprintf(buf, cap,
                     "character %zu is '%c': this is URL-safe base64 ('-' and '_'); attnd takes "
                     "standard base64 ('+' and '/', as Python's base64.b64encode writes)",
                     i, c);
        else if (c == ' ' || c == '\t')
            snprintf(buf, cap,
                     "character %zu is a %s: base64 text may be wrapped in lines, but "
                     "holds no spaces",
                     i, c == ' ' ? "space" : "tab");
        else if (c == '\n' || c == '\r')
            snprintf(buf, cap,
                     "character %zu is a raw line break, which a JSON string cannot "
                     "hold (write it as \\n)",
                     i);
        else if (c < 0x20 || c >= 0x7f)
            snprintf(buf, cap, "character %zu is the byte 0x%02x, not base64", i, c);
        else
            snprintf(buf, cap, "character %zu is '%c', not base64", i, c);
        return;
    }
    if (chars % 4 == 1)
        snprintf(buf, cap, "%zu base64 characters: no base64 text has 4k+1 of them (cut short?)",
                 chars);
    else if (pads && (chars % 4 == 0 || pads > 4 - chars % 4))
        snprintf(buf, cap, "%zu '=' after %zu characters: wrong padding", pads, chars);
    else
        snprintf(buf, cap, "not valid base64");
}
