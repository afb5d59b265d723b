/* floattext.c - float32 to decimal text and back, exactly and fast (see
 * floattext.h). Printing gives the text "%.9g" gives; reading gives the float32
 * nearest the decimal, as strtof does. Both compute in double with one
 * multiplication by a power of ten and know the size of their error; when
 * the result is too close to a rounding boundary for that error to be
 * ruled out, they ask the C library, which is exact but slow, and rare
 * (how rare: docs/performance.md, "Answers written on every thread"). No
 * allocation except an over-long number's copy.
 *
 * Why one double multiplication is enough: a float32 has 24 significant
 * bits and a double 53, so a product that carries at most a few double
 * ulps of error decides the float32 rounding (or the ninth decimal digit)
 * unless it lands within those few ulps of the boundary.
 */
#include "floattext.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* P10[k + P10_OFF] = 10^k, each the double nearest it (the compiler rounds
 * the literals correctly; 10^0..10^22 are exact). */
#define P10_OFF 64
static const double P10[129] = {
    1e-64, 1e-63, 1e-62, 1e-61, 1e-60, 1e-59, 1e-58, 1e-57, 1e-56, 1e-55, 1e-54, 1e-53, 1e-52,
    1e-51, 1e-50, 1e-49, 1e-48, 1e-47, 1e-46, 1e-45, 1e-44, 1e-43, 1e-42, 1e-41, 1e-40, 1e-39,
    1e-38, 1e-37, 1e-36, 1e-35, 1e-34, 1e-33, 1e-32, 1e-31, 1e-30, 1e-29, 1e-28, 1e-27, 1e-26,
    1e-25, 1e-24, 1e-23, 1e-22, 1e-21, 1e-20, 1e-19, 1e-18, 1e-17, 1e-16, 1e-15, 1e-14, 1e-13,
    1e-12, 1e-11, 1e-10, 1e-9,  1e-8,  1e-7,  1e-6,  1e-5,  1e-4,  1e-3,  1e-2,  1e-1,  1e0,
    1e1,   1e2,   1e3,   1e4,   1e5,   1e6,   1e7,   1e8,   1e9,   1e10,  1e11,  1e12,  1e13,
    1e14,  1e15,  1e16,  1e17,  1e18,  1e19,  1e20,  1e21,  1e22,  1e23,  1e24,  1e25,  1e26,
    1e27,  1e28,  1e29,  1e30,  1e31,  1e32,  1e33,  1e34,  1e35,  1e36,  1e37,  1e38,  1e39,
    1e40,  1e41,  1e42,  1e43,  1e44,  1e45,  1e46,  1e47,  1e48,  1e49,  1e50,  1e51,  1e52,
    1e53,  1e54,  1e55,  1e56,  1e57,  1e58,  1e59,  1e60,  1e61,  1e62,  1e63,  1e64};

static const char DIGITS2[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static inline uint64_t dbits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* ---- printing ---- */

/* The last 8 of the 9 digits of n < 10^9 as 8 ASCII bytes in a word
 * (little-endian: the first digit in the lowest byte); *first is the
 * first digit. y / 2^57 is n / 10^8 with the first digit before the binary
 * point; each step brings two more digits in front of it. The constant is
 * 2^57 / 10^8 rounded up; its error stays below the gap to the next digit
 * at every step for every n < 10^9 (the unit test checks them all). */
static inline uint64_t digits_word(uint32_t n, char *first) {
    const uint64_t low = (1ull << 57) - 1;
    uint64_t y = (uint64_t)n * 1441151881u, w = 0;
    *first = (char)('0' + (y >> 57));
    for (int k = 0; k < 4; k++) {
        y = (y & low) * 100;
        uint16_t two;
        memcpy(&two, DIGITS2 + 2 * (y >> 57), 2);
        w |= (uint64_t)two << (16 * k);
    }
    return w;
}

void attnd_fmt_digits9(char *d, uint32_t n) {
    uint64_t w = digits_word(n, d);
    memcpy(d + 1, &w, 8);
}

/* The nine significant digits of x (a finite float32, > 0, as a double):
 * *n in [1e8, 1e9) and the decimal exponent of its first digit. Returns -1
 * when x·10^k lands too near a half for the product's error (at most
 * 2^-22 here) to tell which way the ninth digit rounds. */
static inline int digits9(double x, uint32_t *n, int *exp10) {
    int e2 = (int)((dbits(x) >> 52) & 0x7ff) - 1023; /* x in [2^e2, 2^(e2+1)) */
    int e10 = (e2 * 1233) >> 12;            /* floor(e2·log10 2): 10^e10 <= x or one less */
    if (x >= P10[e10 + 1 + P10_OFF]) e10++; /* now 10^e10 <= x < 10^(e10+1) */
    double r = x * P10[8 - e10 + P10_OFF];  /* in [1e8, 1e9), give or take 2^-22 */
    uint32_t fl = (uint32_t)r;
    double frac = r - (double)fl;
    if (frac > 0.5 - 1e-6 && frac < 0.5 + 1e-6) return -1;
    fl += frac > 0.5;
    if (fl < 100000000u) return -1; /* x next to a power of ten: let the C library say */
    if (fl >= 1000000000u) {        /* 999999999.5 and up */
        fl = 100000000u;
        e10++;
    }
    *n = fl;
    *exp10 = e10;
    return 0;
}

/* All stores below are whole words into dst's F32_TEXT_MAX bytes; the text
 * ends where the returned length says, the bytes past it are scratch. */
size_t attnd_fmt_f32(char *dst, float v) {
    char *s = dst;
    if (!isfinite(v)) {
        *s = '0';
        return 1;
    }
    *s = '-';
    s += signbit(v) != 0; /* no branch: signs of attention outputs are coin flips */
    double x = fabs((double)v);
    if (x == 0) {
        *s++ = '0';
        return (size_t)(s - dst);
    }
    uint32_t n;
    int e;
    if (digits9(x, &n, &e) < 0) /* a near tie: the C library rounds the exact value */
        return (size_t)(s - dst) + (size_t)snprintf(s, F32_TEXT_MAX, "%.9g", x);
    char d0;
    uint64_t w = digits_word(n, &d0);
    uint64_t t = w ^ 0x3030303030303030ull;      /* zero bytes where w holds '0' */
    int nd = t ? 9 - __builtin_clzll(t) / 8 : 1; /* significant digits, trailing zeros gone */
    if (e < -4 || e >= 9) {                      /* d.ddde+XX */
        *s++ = d0;
        if (nd > 1) {
            *s = '.';
            memcpy(s + 1, &w, 8);
            s += nd;
        }
        int ae = e < 0 ? -e : e;
        s[0] = 'e';
        s[1] = e < 0 ? '-' : '+';
        memcpy(s + 2, DIGITS2 + 2 * ae, 2);
        return (size_t)(s + 4 - dst);
    }
    if (e >= 0) { /* ddd.ddd: e + 1 digits before the point */
        *s = d0;
        memcpy(s + 1, &w, 8);
        s += e + 1;
        if (nd > e + 1) { /* then e <= 7 */
            uint64_t rest = w >> (8 * e);
            *s = '.';
            memcpy(s + 1, &rest, 8);
            s += 1 + nd - (e + 1);
        }
        return (size_t)(s - dst);
    }
    /* 0.000ddd: -e - 1 zeros after the point */
    memcpy(s, "0.000000", 8);
    s += 1 - e;
    *s = d0;
    memcpy(s + 1, &w, 8);
    return (size_t)(s + nd - dst);
}

void attnd_sb_floats(attnd_sbuf *b, const float *x, size_t n) {
    /* reserve in chunks so the inner loop writes straight into memory */
    size_t i = 0;
    while (i < n) {
        size_t chunk = n - i < 4096 ? n - i : 4096;
        if (attnd_sb_reserve(b, chunk * (F32_TEXT_MAX + 1)) < 0) return;
        char *s = b->p + b->len;
        for (size_t k = 0; k < chunk; k++, i++) {
            if (i) *s++ = ',';
            s += attnd_fmt_f32(s, x[i]);
        }
        b->len = (size_t)(s - b->p);
        b->p[b->len] = '\0';
    }
}

static void tensor_json(attnd_sbuf *b, const float *x, int rank, const int *shape) {
    if (rank == 1) {
        attnd_sb_putc(b, '[');
        attnd_sb_floats(b, x, (size_t)shape[0]);
        attnd_sb_putc(b, ']');
        return;
    }
    size_t inner = 1;
    for (int i = 1; i < rank; i++)
        inner *= (size_t)shape[i];
    attnd_sb_putc(b, '[');
    for (int i = 0; i < shape[0]; i++) {
        if (i) attnd_sb_putc(b, ',');
        tensor_json(b, x + (size_t)i * inner, rank - 1, shape + 1);
    }
    attnd_sb_putc(b, ']');
}

void attnd_sb_tensor_json(attnd_sbuf *b, const float *x, int rank, const int *shape) {
    tensor_json(b, x, rank, shape);
}

/* ---- reading ---- */

/* A JSON number's parts: the first 19 significant digits as an integer,
 * the power of ten that scales them, whether nonzero digits were dropped
 * past the 19th. */
typedef struct {
    uint64_t m;
    int exp10;
    int neg;
    int inexact;
} decimal;

static inline int is_digit(char c) {
    return (unsigned char)(c - '0') < 10;
}

/* 1 when the 8 bytes at p are all ASCII digits; *v is then their value. */
static inline int eight_digits(const char *p, uint64_t *v) {
    uint64_t x;
    memcpy(&x, p, 8); /* little-endian: p[0] is the lowest byte */
    if ((x & 0xf0f0f0f0f0f0f0f0ull) != 0x3030303030303030ull ||
        ((x + 0x0606060606060606ull) & 0xf0f0f0f0f0f0f0f0ull) != 0x3030303030303030ull)
        return 0;
    x -= 0x3030303030303030ull;
    x = (x * 10 + (x >> 8)) & 0x00ff00ff00ff00ffull;   /* pairs */
    x = (x * 100 + (x >> 16)) & 0x0000ffff0000ffffull; /* fours */
    *v = (x * 10000 + (x >> 32)) & 0xffffffffull;      /* eight */
    return 1;
}

/* Digits at p into *m (wrapping past 19 digits, which the caller sees by
 * the count); returns the first byte after them. */
static inline const char *digits(const char *p, const char *end, uint64_t *m) {
    uint64_t v, r = *m;
    while (end - p >= 8 && eight_digits(p, &v)) {
        r = r * 100000000u + v;
        p += 8;
    }
    for (; p < end && is_digit(*p); p++)
        r = r * 10 + (uint64_t)(*p - '0');
    *m = r;
    return p;
}

/* The exponent part at p ("e-12"), added to *exp10; NULL when it is not
 * one (an 'e' without digits). */
static inline const char *exponent(const char *p, const char *end, int *exp10) {
    if (p >= end || (*p != 'e' && *p != 'E')) return p;
    p++;
    int neg = 0;
    if (p < end && (*p == '+' || *p == '-')) neg = *p++ == '-';
    if (p >= end || !is_digit(*p)) return NULL;
    int ev = 0;
    for (; p < end && is_digit(*p); p++)
        if (ev < 100000) ev = ev * 10 + (*p - '0');
    *exp10 += neg ? -ev : ev;
    return p;
}

/* Numbers of more than 19 digits: the first 19 significant ones are kept,
 * and whether any dropped one was not 0. */
static size_t scan_long(const char *s, size_t n, decimal *d) {
    /* the grammar was checked by scan_number up to the exponent */
    const char *p = s + d->neg, *end = s + n;
    uint64_t m = 0;
    int sig = 0, exp10 = 0, inexact = 0;
    for (; p < end && is_digit(*p); p++) {
        if (sig < 19) {
            m = m * 10 + (uint64_t)(*p - '0');
            sig += m != 0;
        } else {
            exp10++;
            inexact |= *p != '0';
        }
    }
    if (p < end && *p == '.') {
        for (p++; p < end && is_digit(*p); p++) {
            if (sig < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                sig += m != 0; /* leading zeros of 0.000ddd are not significant */
                exp10--;
            } else {
                inexact |= *p != '0';
            }
        }
    }
    p = exponent(p, end, &exp10);
    if (!p) return 0;
    d->m = m;
    d->exp10 = exp10;
    d->inexact = inexact;
    return (size_t)(p - s);
}

/* Scans the strict JSON number grammar at s[0..n). Returns its length, or
 * 0 when s does not start with a number. */
static inline size_t scan_number(const char *s, size_t n, decimal *d) {
    const char *p = s, *end = s + n;
    d->neg = p < end && *p == '-';
    p += d->neg;
    if (p >= end || !is_digit(*p)) return 0;
    const char *first = p;
    uint64_t m = 0;
    if (*p == '0')
        p++;
    else if (end - p > 1 && p[1] == '.') /* one digit before the point: the common case */
        m = (uint64_t)(*p++ - '0');
    else
        p = digits(p, end, &m);
    int exp10 = 0;
    size_t count = (size_t)(p - first);
    if (p < end && *p == '.') {
        const char *f = ++p;
        p = digits(p, end, &m);
        if (p == f) return 0;
        exp10 = -(int)(p - f);
        count += (size_t)(p - f);
    }
    if (count > 19) return scan_long(s, n, d);
    p = exponent(p, end, &exp10);
    if (!p) return 0;
    d->m = m;
    d->exp10 = exp10;
    d->inexact = 0;
    return (size_t)(p - s);
}

/* The C library on a NUL-terminated copy of s[0..n): exact. */
static int strtox(const char *s, size_t n, double *dv, float *fv) {
    char tmp[128];
    char *buf = n < sizeof(tmp) ? tmp : malloc(n + 1);
    if (!buf) return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (dv) *dv = strtod(buf, NULL);
    if (fv) *fv = strtof(buf, NULL);
    if (buf != tmp) free(buf);
    return 0;
}

size_t attnd_parse_number(const char *s, size_t n, double *v) {
    decimal d;
    size_t len = scan_number(s, n, &d);
    if (!len) return 0;
    double r;
    if (d.m == 0) {
        r = 0;
    } else if (!d.inexact && d.m <= (1ull << 53) && d.exp10 >= -22 && d.exp10 <= 22) {
        /* both operands exact, one rounding: the nearest double */
        r = d.exp10 >= 0 ? (double)d.m * P10[d.exp10 + P10_OFF]
                         : (double)d.m / P10[-d.exp10 + P10_OFF];
    } else {
        return strtox(s, len, v, NULL) < 0 ? 0 : len;
    }
    *v = d.neg ? -r : r;
    return len;
}

/* 1 when x (a double > 0 that is within 16 of its ulps of the exact value)
 * may round to a different float32 than the exact value: it lies within 16
 * ulps of a float32 rounding boundary (halfway between two floats), or is
 * too small for the test. */
static inline int near_f32_boundary(double x) {
    uint64_t u = dbits(x);
    int e2 = (int)((u >> 52) & 0x7ff) - 1023;
    if (e2 < -150) return 1;               /* at or below half the least subnormal */
    int drop = e2 >= -126 ? 29 : -97 - e2; /* double bits below the float32's last one */
    uint64_t sig = (u & ((1ull << 52) - 1)) | (1ull << 52);
    uint64_t rem = sig & ((1ull << drop) - 1); /* drop <= 53 */
    uint64_t half = 1ull << (drop - 1);
    return rem + 16 >= half && rem <= half + 16;
}

/* The float32 nearest d, or 1 when the C library must say (see
 * near_f32_boundary). */
static inline int decimal_f32(const decimal *d, float *v) {
    float f;
    if (d->m == 0) {
        f = 0;
    } else if (d->exp10 >= -P10_OFF && d->exp10 <= P10_OFF) {
        /* (double)m, the power and the product each round once (2^-53 each),
         * dropped digits add less than 1e-18: under 4 ulps in all */
        double x = (double)d->m * P10[d->exp10 + P10_OFF];
        if (x >= 0x1p128)
            f = INFINITY; /* past FLT_MAX by far more than the error */
        else if (near_f32_boundary(x))
            return 1;
        else
            f = (float)x;
    } else {
        return 1;
    }
    *v = d->neg ? -f : f;
    return 0;
}

static inline size_t f32_at(const char *s, size_t n, float *v) {
    decimal d;
    size_t len = scan_number(s, n, &d);
    if (!len) return 0;
    if (decimal_f32(&d, v)) return strtox(s, len, NULL, v) < 0 ? 0 : len;
    return len;
}

size_t attnd_parse_f32(const char *s, size_t n, float *v) {
    return f32_at(s, n, v);
}

static inline const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

size_t attnd_parse_f32_row(const char *s, size_t n, float *out, size_t max, size_t *count) {
    const char *p = s, *end = s + n, *done = s;
    size_t k = 0;
    while (k < max) {
        const char *q = skip_ws(p, end);
        float v;
        size_t len = f32_at(q, (size_t)(end - q), &v);
        if (!len || !isfinite(v)) break;
        out[k++] = v;
        done = skip_ws(q + len, end);
        if (done >= end || *done != ',') break;
        p = done + 1;
    }
    *count = k;
    return (size_t)(done - s);
}
