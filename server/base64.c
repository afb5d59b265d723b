/* base64.c - standard base64 (RFC 4648 section 4) both ways, two
 * characters per table lookup (see codec.h). Pure and thread-safe; the
 * tables are built once. */
#include "codec.h"

#include <pthread.h>
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

void sb_b64(sbuf *b, const void *data, size_t n) {
    const unsigned char *p = data;
    if (sb_reserve(b, (n + 2) / 3 * 4) < 0) return;
    pthread_once(&b64_once, b64_tables);
    char *o = b->p + b->len;
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
    b->len = (size_t)(o - b->p);
    b->p[b->len] = '\0';
}

size_t b64_decoded_max(size_t n) {
    return n / 4 * 3 + 3;
}

int b64_decode(const char *s, size_t n, void *out, size_t cap, size_t *outlen) {
    pthread_once(&b64_once, b64_tables);
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
