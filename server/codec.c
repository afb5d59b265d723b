/* codec.c - text buffer, float32 printing and reading, base64, JSON string
 * escaping, monotonic clock. See codec.h. Everything here is pure and
 * thread-safe; nothing allocates except the sbuf functions. */
#include "codec.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- sbuf ---- */

void sb_init(sbuf *b) {
    memset(b, 0, sizeof(*b));
}

void sb_free(sbuf *b) {
    if (!b) return;
    free(b->p);
    memset(b, 0, sizeof(*b));
}

int sb_reserve(sbuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) goto fail;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) goto fail;
    b->p = p;
    b->cap = cap;
    return 0;
fail:
    b->oom = 1;
    return -1;
}

void sb_put(sbuf *b, const void *s, size_t n) {
    if (sb_reserve(b, n) < 0) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sb_puts(sbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

void sb_putc(sbuf *b, char c) {
    if (sb_reserve(b, 1) < 0) return;
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}

void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof(tmp)) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    if (sb_reserve(b, (size_t)n) < 0) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *sb_take(sbuf *b, size_t *len) {
    if (b->oom) {
        sb_free(b);
        return NULL;
    }
    if (!b->p && sb_reserve(b, 0) < 0) return NULL;
    b->p[b->len] = '\0';
    char *p = b->p;
    if (len) *len = b->len;
    memset(b, 0, sizeof(*b));
    return p;
}

size_t utf8_seq_len(const unsigned char *s, const unsigned char *end) {
    unsigned c = s[0];
    size_t n;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, min = 0x10000;
    else
        return 0;
    if ((size_t)(end - s) < n) return 0;
    unsigned cp = c & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

void sb_json_str(sbuf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    const unsigned char *end = p + strlen(s);
    sb_putc(b, '"');
    while (p < end) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            sb_putc(b, '\\');
            sb_putc(b, (char)c);
            p++;
        } else if (c == '\n') {
            sb_puts(b, "\\n");
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            sb_put(b, e, 6);
            p++;
        } else if (c < 0x80) {
            sb_putc(b, (char)c);
            p++;
        } else {
            size_t n = utf8_seq_len(p, end);
            if (n) {
                sb_put(b, p, n);
                p += n;
            } else {
                sb_puts(b, "\\ufffd");
                p++;
            }
        }
    }
    sb_putc(b, '"');
}

/* ---- float32 printing ---- */

static const double P10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                               1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                               1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* x * 10^k with k in [-60, 60], each step exact in its operands. */
static double scale10(double x, int k) {
    while (k > 22) {
        x *= P10[22];
        k -= 22;
    }
    while (k < -22) {
        x /= P10[22];
        k += 22;
    }
    return k >= 0 ? x * P10[k] : x / P10[-k];
}

/* The nine significant digits of v (v finite, nonzero) as an integer in
 * [1e8, 1e9) and the decimal exponent of the first; returns -1 when the
 * double arithmetic is too close to a rounding tie to be trusted. */
static int digits9(double x, uint32_t *digits, int *exp10) {
    uint64_t xb;
    memcpy(&xb, &x, 8);
    int e2 = (int)((xb >> 52) & 0x7ff) - 1022; /* x in [2^(e2-1), 2^e2); x is a normal double */
    int e10 = (int)floor((e2 - 1) * 0.30102999566398120);
    double r = scale10(x, 8 - e10);
    if (r >= 1e9) {
        e10++;
        r = scale10(x, 8 - e10);
    } else if (r < 1e8) {
        e10--;
        r = scale10(x, 8 - e10);
    }
    uint32_t fl = (uint32_t)r; /* r in [1e8, 1e9) */
    double frac = r - (double)fl;
    if (fabs(frac - 0.5) < 1e-5) return -1;
    uint32_t n = fl + (frac > 0.5);
    if (n >= 1000000000u) {
        n = 100000000u;
        e10++;
    }
    *digits = n;
    *exp10 = e10;
    return 0;
}

size_t fmt_f32(char *dst, float v) {
    char *s = dst;
    if (!isfinite(v)) {
        *s = '0';
        return 1;
    }
    if (signbit(v)) *s++ = '-';
    double x = fabs((double)v);
    if (x == 0) {
        *s++ = '0';
        return (size_t)(s - dst);
    }
    uint32_t n;
    int e;
    if (digits9(x, &n, &e) < 0) {
        /* a near tie: let the C library round the exact binary value */
        int k = snprintf(s, F32_TEXT_MAX, "%.9g", x);
        return (size_t)(s - dst) + (size_t)k;
    }
    char d[16] = {0}; /* 9 digits, then room for the fixed-size copies below */
    for (int i = 8; i >= 0; i--) {
        d[i] = (char)('0' + n % 10);
        n /= 10;
    }
    int nd = 9;
    while (nd > 1 && d[nd - 1] == '0')
        nd--;
    if (e < -4 || e >= 9) { /* d.ddde+XX */
        *s++ = d[0];
        if (nd > 1) {
            *s++ = '.';
            memcpy(s, d + 1,
                   8); /* fixed size: no call; the extra bytes are overwritten or unused */
            s += nd - 1;
        }
        *s++ = 'e';
        *s++ = e < 0 ? '-' : '+';
        int ae = e < 0 ? -e : e;
        if (ae >= 10) {
            *s++ = (char)('0' + ae / 10);
            *s++ = (char)('0' + ae % 10);
        } else {
            *s++ = '0';
            *s++ = (char)('0' + ae);
        }
    } else if (e >= 0) { /* ddd.ddd */
        int ip = e + 1;
        for (int i = 0; i < ip; i++)
            *s++ = i < nd ? d[i] : '0';
        if (nd > ip) {
            *s++ = '.';
            memcpy(s, d + ip, 8);
            s += nd - ip;
        }
    } else { /* 0.000ddd */
        *s++ = '0';
        *s++ = '.';
        for (int i = 0; i < -e - 1; i++)
            *s++ = '0';
        memcpy(s, d, 9);
        s += nd;
    }
    return (size_t)(s - dst);
}

void sb_floats(sbuf *b, const float *x, size_t n) {
    /* reserve in chunks so the inner loop writes straight into memory */
    size_t i = 0;
    while (i < n) {
        size_t chunk = n - i < 4096 ? n - i : 4096;
        if (sb_reserve(b, chunk * (F32_TEXT_MAX + 1)) < 0) return;
        char *s = b->p + b->len;
        for (size_t k = 0; k < chunk; k++, i++) {
            if (i) *s++ = ',';
            s += fmt_f32(s, x[i]);
        }
        b->len = (size_t)(s - b->p);
        b->p[b->len] = '\0';
    }
}

static void tensor_json(sbuf *b, const float *x, int rank, const int *shape) {
    if (rank == 1) {
        sb_putc(b, '[');
        sb_floats(b, x, (size_t)shape[0]);
        sb_putc(b, ']');
        return;
    }
    size_t inner = 1;
    for (int i = 1; i < rank; i++)
        inner *= (size_t)shape[i];
    sb_putc(b, '[');
    for (int i = 0; i < shape[0]; i++) {
        if (i) sb_putc(b, ',');
        tensor_json(b, x + (size_t)i * inner, rank - 1, shape + 1);
    }
    sb_putc(b, ']');
}

void sb_tensor_json(sbuf *b, const float *x, int rank, const int *shape) {
    tensor_json(b, x, rank, shape);
}

/* ---- number reading ---- */

/* approx: see parse_number_f32 in codec.h. */
static size_t parse_num(const char *s, size_t n, double *v, int approx) {
    size_t i = 0;
    int neg = 0;
    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    if (i >= n || s[i] < '0' || s[i] > '9') return 0;
    uint64_t m = 0;
    int sig = 0;     /* significant digits kept in m */
    int dropped = 0; /* integer digits beyond the 19 kept */
    int exp10 = 0;
    if (s[i] == '0') {
        i++;
    } else {
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (sig < 19) {
                m = m * 10 + (uint64_t)(s[i] - '0');
                sig++;
            } else {
                dropped++;
            }
            i++;
        }
    }
    exp10 += dropped;
    int inexact = dropped > 0;
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (m == 0 && s[i] == '0') {
                exp10--;
            } else if (sig < 19) {
                m = m * 10 + (uint64_t)(s[i] - '0');
                sig++;
                exp10--;
            } else if (s[i] != '0') {
                inexact = 1;
            }
            i++;
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        int eneg = 0;
        if (i < n && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
        if (i >= n || s[i] < '0' || s[i] > '9') return 0;
        int ev = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (ev < 100000) ev = ev * 10 + (s[i] - '0');
            i++;
        }
        exp10 += eneg ? -ev : ev;
    }
    double r;
    if (m == 0) {
        r = 0;
    } else if (!inexact && m <= (1ull << 53) && exp10 >= -22 && exp10 <= 22) {
        r = exp10 >= 0 ? (double)m * P10[exp10] : (double)m / P10[-exp10];
    } else if (approx && exp10 >= -44 && exp10 <= 44) {
        /* up to three roundings in double: a few ulps of double, far below
         * the float32 rounding the caller does next */
        r = scale10((double)m, exp10);
    } else { /* slow road: the C library's correctly rounded strtod */
        char tmp[512];
        char *buf = i < sizeof(tmp) ? tmp : malloc(i + 1);
        if (!buf) return 0;
        memcpy(buf, s, i);
        buf[i] = '\0';
        r = strtod(buf, NULL);
        if (buf != tmp) free(buf);
        *v = r;
        return i;
    }
    *v = neg ? -r : r;
    return i;
}

size_t parse_number(const char *s, size_t n, double *v) {
    return parse_num(s, n, v, 0);
}

size_t parse_number_f32(const char *s, size_t n, double *v) {
    return parse_num(s, n, v, 1);
}

/* ---- base64 ---- */

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

/* ---- clock ---- */

uint64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
