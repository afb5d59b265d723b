/* test_server_codec.c - the server's byte codecs: float32 printing (same
 * text as "%.9g", parses back bit for bit), number reading, base64. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/base/buffer.h"
#include "../server/base/utf8.h"
#include "../server/codec/base64.h"
#include "../server/codec/floattext.h"
#include "../server/codec/tensor.h"
#include "check_run.h"

/* The plain build runs every random and swept check in full; under
 * AddressSanitizer (make asan) a tenth of each, and the digit split's
 * first 10^8 values, which keeps that suite to a minute. */
#ifdef __SANITIZE_ADDRESS__
#define SAN_DIV 10
#else
#define SAN_DIV 1
#endif

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t rnd32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Prints f both ways; fails on any difference or a lossy round trip (read
 * back as a double and as a float32). */
static void check_one(float f) {
    char mine[F32_TEXT_MAX + 1], ref[64];
    size_t n = attnd_fmt_f32(mine, f);
    ck_assert_uint_le(n, F32_TEXT_MAX);
    mine[n] = '\0';
    snprintf(ref, sizeof(ref), "%.9g", (double)f);
    ck_assert_msg(strcmp(mine, ref) == 0, "bits %08x: printed %s, %%.9g gives %s", bits(f), mine,
                  ref);
    double back = 0;
    ck_assert_uint_eq(attnd_parse_number(mine, n, &back), n);
    ck_assert_msg(bits((float)back) == bits(f), "%s read back as %08x, was %08x", mine,
                  bits((float)back), bits(f));
    float backf = 0;
    ck_assert_uint_eq(attnd_parse_f32(mine, n, &backf), n);
    ck_assert_msg(bits(backf) == bits(f), "%s read back as %08x, was %08x", mine, bits(backf),
                  bits(f));
}

START_TEST(test_f32_special_values) {
    float v[] = {0.0f,    -0.0f,       1.0f,          -1.0f,           0.1f,      1e-45f, FLT_MIN,
                 FLT_MAX, -FLT_MAX,    123456789.f,   999999999.f,     1e9f,      1e-5f,  0.0001f,
                 1e-4f,   123456.789f, 3.4028235e38f, 1.17549435e-38f, 16777216.f};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        check_one(v[i]);
}
END_TEST

START_TEST(test_f32_random_bits_round_trip) {
    for (int i = 0; i < 300000 / SAN_DIV; i++) {
        float f = from_bits(rnd32());
        if (!isfinite(f)) continue;
        check_one(f);
    }
}
END_TEST

START_TEST(test_f32_random_values_round_trip) {
    /* the range attention outputs live in */
    for (int i = 0; i < 150000 / SAN_DIV; i++) {
        float f = ((float)rnd32() / 4294967296.0f - 0.5f) * 8.0f;
        check_one(f);
    }
}
END_TEST

START_TEST(test_f32_every_997th_float) {
    /* 4.3 million floats spread over every exponent, both signs */
    for (uint64_t u = 0; u < 0x100000000ull; u += 997 * SAN_DIV) {
        float f = from_bits((uint32_t)u);
        if (isfinite(f)) check_one(f);
    }
}
END_TEST

START_TEST(test_f32_powers_of_ten_and_neighbours) {
    /* where the digit count and the %g style change: each float nearest
     * 10^k and its 3 neighbours on each side, 999999999.5-ish values */
    for (int k = -45; k <= 38; k++) {
        char s[16];
        snprintf(s, sizeof(s), "1e%d", k);
        float f = strtof(s, NULL);
        for (int d = 0; d < 3; d++) {
            check_one(f);
            check_one(-f);
            float up = f, down = f;
            for (int i = 0; i <= d; i++) {
                up = nextafterf(up, INFINITY);
                down = nextafterf(down, 0);
            }
            if (isfinite(up)) check_one(up);
            check_one(down);
        }
    }
    float v[] = {999999999.f,     999999940.f, 99999999.5f,  9.99999999e-5f, 9.9999997e-5f, 1e-4f,
                 0.000099999997f, 123456792.f, 4294967296.f, 1.5e-45f,       3e-45f,        7e-45f};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        check_one(v[i]);
}
END_TEST

START_TEST(test_digits9_every_value) {
    /* the multiply-and-shift digit split is exact for every n < 10^9: held
     * to a decimal counter stepped alongside */
    char want[9], got[9];
    memset(want, '0', sizeof(want));
    const uint32_t end = 1000000000u / SAN_DIV; /* every digit position turns over */
    for (uint32_t n = 0; n < end; n++) {
        attnd_fmt_digits9(got, n);
        if (memcmp(got, want, 9) != 0) ck_abort_msg("%u written as %.9s, not %.9s", n, got, want);
        for (int i = 8; i >= 0 && ++want[i] > '9'; i--)
            want[i] = '0';
    }
}
END_TEST

START_TEST(test_f32_nonfinite_written_as_zero) {
    char buf[F32_TEXT_MAX];
    ck_assert_uint_eq(attnd_fmt_f32(buf, NAN), 1);
    ck_assert_int_eq(buf[0], '0');
    ck_assert_uint_eq(attnd_fmt_f32(buf, -INFINITY), 1);
    ck_assert_int_eq(buf[0], '0');
}
END_TEST

START_TEST(test_sb_floats_and_tensor) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    float x[6] = {1, 2.5f, -3, 0.125f, 1e-7f, 7};
    int shape[2] = {2, 3};
    attnd_sb_tensor_json(&b, x, 2, shape);
    ck_assert_str_eq(b.p, "[[1,2.5,-3],[0.125,1.00000001e-07,7]]");
    attnd_sb_free(&b);
}
END_TEST

START_TEST(test_parse_number_matches_strtod) {
    const char *ok[] = {"0",
                        "-0",
                        "1",
                        "-12.5e-3",
                        "1e22",
                        "1e23",
                        "123456789012345678901234",
                        "0.000001",
                        "4.9e-324",
                        "1.7976931348623157e308",
                        "2.5E+3",
                        "0.1",
                        "3.14159265358979323846",
                        "1e-400",
                        "1e400"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        double v = -99, ref = strtod(ok[i], NULL);
        size_t n = attnd_parse_number(ok[i], strlen(ok[i]), &v);
        ck_assert_msg(n == strlen(ok[i]), "%s: consumed %zu", ok[i], n);
        ck_assert_msg(v == ref || (isinf(v) && isinf(ref)), "%s: %.17g vs %.17g", ok[i], v, ref);
    }
    /* random decimals with 1..20 digits and exponents */
    for (int i = 0; i < 200000 / SAN_DIV; i++) {
        char s[64];
        int digits = 1 + (int)(rnd32() % 20), e = (int)(rnd32() % 80) - 40;
        int k = 0;
        if (rnd32() & 1) s[k++] = '-';
        s[k++] = (char)('1' + rnd32() % 9);
        if (digits > 1) s[k++] = '.';
        for (int d = 1; d < digits; d++)
            s[k++] = (char)('0' + rnd32() % 10);
        k += snprintf(s + k, sizeof(s) - (size_t)k, "e%d", e);
        double v, ref = strtod(s, NULL);
        ck_assert_uint_eq(attnd_parse_number(s, (size_t)k, &v), (size_t)k);
        ck_assert_msg(v == ref, "%s: %.17g vs %.17g", s, v, ref);
    }
}
END_TEST

/* attnd_parse_f32 must give what strtof gives, bit for bit. */
static void same_as_strtof(const char *s) {
    size_t len = strlen(s);
    float v = 12345, ref = strtof(s, NULL);
    ck_assert_msg(attnd_parse_f32(s, len, &v) == len, "%s: not read whole", s);
    ck_assert_msg(bits(v) == bits(ref), "%s read as %08x (%.9g), strtof gives %08x (%.9g)", s,
                  bits(v), (double)v, bits(ref), (double)ref);
}

START_TEST(test_parse_f32_printed_floats) {
    /* float32 values as clients print them: numpy's 17 digits, %.9g, 12 and 20 digits */
    const char *fmts[] = {"%.17g", "%.9g", "%.12g", "%.17e", "%.20e", "%.8e"};
    for (int i = 0; i < 600000 / SAN_DIV; i++) {
        float f = from_bits(rnd32());
        if (!isfinite(f)) continue;
        char s[64];
        snprintf(s, sizeof(s), fmts[i % 6], (double)f);
        same_as_strtof(s);
        if (i % 6 != 5) { /* 9 or more digits name the float itself */
            float v;
            attnd_parse_f32(s, strlen(s), &v);
            ck_assert_msg(bits(v) == bits(f), "%s read as %08x, was %08x", s, bits(v), bits(f));
        }
    }
}
END_TEST

START_TEST(test_parse_f32_random_decimals) {
    /* 1 to 40 digits, exponents across and past the float32 range */
    for (int i = 0; i < 1000000 / SAN_DIV; i++) {
        char s[96];
        int k = 0, digits = 1 + (int)(rnd32() % 40), point = (int)(rnd32() % (unsigned)digits);
        if (rnd32() & 1) s[k++] = '-';
        s[k++] = (char)('1' + rnd32() % 9);
        for (int d = 1; d < digits; d++) {
            if (d == point + 1) s[k++] = '.';
            s[k++] = (char)('0' + rnd32() % 10);
        }
        int e = (int)(rnd32() % 110) - 70;
        snprintf(s + k, sizeof(s) - (size_t)k, "e%d", e);
        same_as_strtof(s);
    }
}
END_TEST

/* The exact decimal of the double x (any float32 midpoint is one). */
static void exact_decimal(char *s, size_t cap, double x) {
    snprintf(s, cap, "%.160e", x);
    char *e = strchr(s, 'e'), *z = e; /* drop the zeros before the exponent */
    while (z[-1] == '0')
        z--;
    if (z[-1] == '.') z--;
    memmove(z, e, strlen(e) + 1);
}

START_TEST(test_parse_f32_midpoints) {
    /* halfway between two floats (normal, subnormal, next to FLT_MAX), and
     * the decimals just below and above it: the hard cases of any reader */
    for (int i = 0; i < 200000 / SAN_DIV; i++) {
        uint32_t u = rnd32() & 0x7fffffffu;
        if (i % 4 == 0) u &= 0x007fffffu;              /* subnormal */
        if (i % 97 == 0) u = 0x7f7fffffu - (u & 0xff); /* near FLT_MAX */
        float f = from_bits(u);
        if (!isfinite(f)) continue;
        double next = u == 0x7f7fffffu ? 0x1p128 : (double)nextafterf(f, INFINITY);
        double mid = ((double)f + next) / 2; /* exact: 25 bits */
        char s[256], t[256];
        exact_decimal(s, sizeof(s), mid);
        same_as_strtof(s);
        /* just above: a 1 appended to the digits; just below: the last digit cut */
        char *e = strchr(s, 'e');
        size_t m = (size_t)(e - s);
        snprintf(t, sizeof(t), "%.*s%s1%s", (int)m, s, strchr(s, '.') ? "000" : ".000", e);
        same_as_strtof(t);
        if (m > 3) {
            snprintf(t, sizeof(t), "%.*s%s", (int)m - 1, s, e);
            same_as_strtof(t);
        }
        /* the same number written with 17 and 26 significant digits */
        snprintf(t, sizeof(t), "%.16e", mid);
        same_as_strtof(t);
        snprintf(t, sizeof(t), "%.25e", mid);
        same_as_strtof(t);
    }
}
END_TEST

START_TEST(test_parse_f32_edges) {
    const char *edge[] = {
        "0",
        "-0",
        "0.0e-999",
        "1e-46",
        "7e-46",
        "7.006e-46",
        "7.0064923216240862e-46",
        "7.0064923216240861e-46",
        "1.401298464324817e-45",
        "1.4e-45",
        "1e-45",
        "2.1e-45",
        "1.1754942e-38",
        "1.17549435e-38",
        "1.1754943508222875e-38",
        "3.4028234e38",
        "3.40282346638528859811704183484516925440e+38",
        "3.4028235677973366e38",
        "3.4028235677973365e38",
        "3.4028235677973367e38",
        "3.5e38",
        "1e39",
        "-1e39",
        "1e400",
        "1e-400",
        "16777217",
        "16777216.000000000000000000001",
        "16777218",
        "33554435",
        "0.1",
        "0.30000001192092896",
        "123456789012345678901234567890",
        "0.00000000000000000000000000000000000000000000000000000000000000001e80",
        "100000000000000000000000000000000000000000000000000000000000000000000e-60",
        "1.00000005960464477539062500000001",
        "1.000000059604644775390625",
        "1.00000017881393432617187499999999",
        "1.000000178813934326171875",
        "9999999999999999999999999999999",
        "4.9e-324",
        "2.2250738585072014e-308",
        "1E+2",
        "-1.5E-3"};
    for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++)
        same_as_strtof(edge[i]);
    /* a number longer than any buffer on the stack */
    char big[2048];
    memset(big, '7', sizeof(big) - 1);
    big[1] = '.';
    big[sizeof(big) - 1] = '\0';
    same_as_strtof(big);
}
END_TEST

START_TEST(test_parse_number_refuses_bad_grammar) {
    const char *bad[] = {"-",    ".5", "+1",  "e5",  "-.5",      "1.",
                         "1.e5", "1e", "1e+", "NaN", "Infinity", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        double v;
        size_t n = attnd_parse_number(bad[i], strlen(bad[i]), &v);
        ck_assert_msg(n == 0, "'%s' was read (%zu bytes)", bad[i], n);
    }
    double v;
    /* a leading zero ends the number: the reader then sees "1" as trailing garbage */
    ck_assert_uint_eq(attnd_parse_number("01", 2, &v), 1);
}
END_TEST

START_TEST(test_b64_vectors) {
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        attnd_sbuf b;
        attnd_sb_init(&b);
        attnd_sb_b64(&b, plain[i], strlen(plain[i]));
        attnd_sb_putc(&b, '\0');
        ck_assert_str_eq(b.p, enc[i]);
        attnd_sb_free(&b);
        char out[16];
        size_t n = 99;
        ck_assert_int_eq(attnd_b64_decode(enc[i], strlen(enc[i]), out, sizeof(out), &n, 0), 0);
        ck_assert_uint_eq(n, strlen(plain[i]));
        ck_assert(memcmp(out, plain[i], n) == 0);
    }
    /* unpadded is accepted too */
    char out[16];
    size_t n = 0;
    ck_assert_int_eq(attnd_b64_decode("Zm9vYg", 6, out, sizeof(out), &n, 0), 0);
    ck_assert_uint_eq(n, 4);
}
END_TEST

START_TEST(test_b64_refuses_garbage) {
    const char *bad[] = {"Zm9v!", "Z", "Zm9 v", "Zm=v", "Zm9v\n", "====", "Zg=a"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char out[16];
        size_t n;
        ck_assert_msg(attnd_b64_decode(bad[i], strlen(bad[i]), out, sizeof(out), &n, 0) < 0,
                      "'%s' was decoded", bad[i]);
    }
    char small[2];
    size_t n;
    ck_assert_int_lt(attnd_b64_decode("Zm9v", 4, small, sizeof(small), &n, 0), 0);
}
END_TEST

START_TEST(test_b64_wrapped_lines) {
    /* as base64.encodebytes and MIME write it: 76 characters a line */
    unsigned char in[200], out[200];
    for (int i = 0; i < 200; i++)
        in[i] = (unsigned char)rnd32();
    attnd_sbuf b, w;
    attnd_sb_init(&b);
    attnd_sb_init(&w);
    attnd_sb_b64(&b, in, sizeof(in));
    for (int crlf = 0; crlf < 2; crlf++) {
        w.len = 0;
        for (size_t i = 0; i < b.len; i += 76) {
            attnd_sb_put(&w, b.p + i, b.len - i < 76 ? b.len - i : 76);
            attnd_sb_puts(&w, crlf ? "\r\n" : "\n");
        }
        size_t n = 0;
        ck_assert_int_lt(attnd_b64_decode(w.p, w.len, out, sizeof(out), &n, 0), 0);
        ck_assert_int_eq(attnd_b64_decode(w.p, w.len, out, sizeof(out), &n, 1), 0);
        ck_assert_uint_eq(n, sizeof(in));
        ck_assert(memcmp(in, out, n) == 0);
    }
    attnd_sb_free(&b);
    attnd_sb_free(&w);
    /* unpadded and padded tails, broken anywhere */
    size_t n = 0;
    ck_assert_int_eq(attnd_b64_decode("Zm9v\nYg", 7, out, sizeof(out), &n, 1), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(attnd_b64_decode("Zm\r\n9vYg=\n=", 11, out, sizeof(out), &n, 1), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_lt(attnd_b64_decode("Zm9v\nY", 6, out, sizeof(out), &n, 1), 0);
    ck_assert_int_lt(attnd_b64_decode("Zm=9\nvYg", 8, out, sizeof(out), &n, 1), 0);
}
END_TEST

/* attnd_b64_explain(s) must hold every word. */
static void explained(const char *s, int breaks_ok, const char *w1, const char *w2) {
    char why[256];
    attnd_b64_explain(s, strlen(s), breaks_ok, why, sizeof(why));
    ck_assert_msg(strstr(why, w1), "'%s': '%s' lacks '%s'", s, why, w1);
    if (w2) ck_assert_msg(strstr(why, w2), "'%s': '%s' lacks '%s'", s, why, w2);
}

START_TEST(test_b64_explained) {
    explained("AAAA-AAA", 0, "character 4 is '-'", "URL-safe");
    explained("AAAAAA_A", 0, "character 6 is '_'", "URL-safe");
    explained("AAAA AAA", 0, "character 4 is a space", NULL);
    explained("AAAA\nAAA", 0, "character 4 is a raw line break", NULL);
    explained("AA\nAA\n!A", 1, "character 6 is '!'", NULL);
    explained("AAAA\x01", 0, "character 4 is the byte 0x01", NULL);
    explained("AA=AAAAA", 0, "'=' padding before the end", "character 2");
    explained("AAAAA", 0, "5 base64 characters", "4k+1");
    explained("AAAA=", 0, "wrong padding", NULL);
}
END_TEST

START_TEST(test_b64_random_round_trip) {
    for (int len = 0; len < 300; len++) {
        unsigned char in[300], out[300];
        for (int i = 0; i < len; i++)
            in[i] = (unsigned char)rnd32();
        attnd_sbuf b;
        attnd_sb_init(&b);
        attnd_sb_b64(&b, in, (size_t)len);
        ck_assert_uint_eq(b.len, (size_t)(len + 2) / 3 * 4);
        size_t n = 0;
        ck_assert_int_eq(attnd_b64_decode(b.p ? b.p : "", b.len, out, sizeof(out), &n, 0), 0);
        ck_assert_uint_eq(n, (size_t)len);
        ck_assert(memcmp(in, out, n) == 0);
        attnd_sb_free(&b);
    }
}
END_TEST

/* attnd_first_nonfinite against a plain search: a NaN, +inf or -inf at
 * every place of arrays around its block of 64, with -inf allowed or not. */
static size_t first_bad(const float *x, size_t n, int neg_inf_ok) {
    for (size_t k = 0; k < n; k++)
        if (isnan(x[k]) || (isinf(x[k]) && !(neg_inf_ok && x[k] < 0))) return k;
    return n;
}

START_TEST(test_first_nonfinite_every_place) {
    static const size_t sizes[] = {0, 1, 63, 64, 65, 127, 128, 200};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    float x[200], y[200];
    for (size_t i = 0; i < 200; i++)
        x[i] = (float)i * 0.37f - 30.0f;
    x[7] = FLT_MAX, x[70] = -FLT_MAX, x[130] = FLT_MIN; /* finite, near the edges */
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        for (int ok = 0; ok < 2; ok++)
            ck_assert_uint_eq(attnd_first_nonfinite(x, n, ok), n);
        for (size_t p = 0; p < n; p++)
            for (size_t b = 0; b < 4; b++)
                for (int ok = 0; ok < 2; ok++) {
                    memcpy(y, x, sizeof x);
                    y[p] = bad[b];
                    if (p + 3 < n) y[p + 3] = NAN; /* a second one after it */
                    ck_assert_uint_eq(attnd_first_nonfinite(y, n, ok), first_bad(y, n, ok));
                }
    }
}
END_TEST

START_TEST(test_json_str_escapes) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_sb_json_str(&b, "a\"b\\c\nd\x01");
    ck_assert_str_eq(b.p, "\"a\\\"b\\\\c\\nd\\u0001\"");
    attnd_sb_free(&b);
    /* not UTF-8 (a lone 0xff, a cut sequence, an overlong slash) -> U+FFFD; valid kept */
    attnd_sb_init(&b);
    attnd_sb_json_str(&b, "m\xff\xc3\xa9\xe2\x82\xc0\xaf");
    ck_assert_str_eq(b.p, "\"m\\ufffd\xc3\xa9\\ufffd\\ufffd\\ufffd\\ufffd\"");
    attnd_sb_free(&b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_codec");
    TCase *tc = tcase_create("codec");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_f32_special_values);
    tcase_add_test(tc, test_f32_random_bits_round_trip);
    tcase_add_test(tc, test_f32_random_values_round_trip);
    tcase_add_test(tc, test_f32_every_997th_float);
    tcase_add_test(tc, test_f32_powers_of_ten_and_neighbours);
    tcase_add_test(tc, test_digits9_every_value);
    tcase_add_test(tc, test_f32_nonfinite_written_as_zero);
    tcase_add_test(tc, test_first_nonfinite_every_place);
    tcase_add_test(tc, test_sb_floats_and_tensor);
    tcase_add_test(tc, test_parse_number_matches_strtod);
    tcase_add_test(tc, test_parse_number_refuses_bad_grammar);
    tcase_add_test(tc, test_parse_f32_printed_floats);
    tcase_add_test(tc, test_parse_f32_random_decimals);
    tcase_add_test(tc, test_parse_f32_midpoints);
    tcase_add_test(tc, test_parse_f32_edges);
    tcase_add_test(tc, test_b64_vectors);
    tcase_add_test(tc, test_b64_refuses_garbage);
    tcase_add_test(tc, test_b64_random_round_trip);
    tcase_add_test(tc, test_b64_wrapped_lines);
    tcase_add_test(tc, test_b64_explained);
    tcase_add_test(tc, test_json_str_escapes);
    suite_add_tcase(s, tc);
    return check_run(s);
}
