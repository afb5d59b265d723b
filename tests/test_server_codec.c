/* test_server_codec.c - the server's byte codecs: float32 printing (same
 * text as "%.9g", parses back bit for bit), number reading, base64. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/codec.h"

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

/* Prints f both ways; fails on any difference or a lossy round trip. */
static void check_one(float f) {
    char mine[F32_TEXT_MAX + 1], ref[64];
    size_t n = fmt_f32(mine, f);
    ck_assert_uint_le(n, F32_TEXT_MAX);
    mine[n] = '\0';
    snprintf(ref, sizeof(ref), "%.9g", (double)f);
    ck_assert_msg(strcmp(mine, ref) == 0, "bits %08x: printed %s, %%.9g gives %s", bits(f), mine,
                  ref);
    double back = 0;
    ck_assert_uint_eq(parse_number(mine, n, &back), n);
    ck_assert_msg(bits((float)back) == bits(f), "%s read back as %08x, was %08x", mine,
                  bits((float)back), bits(f));
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
    for (int i = 0; i < 300000; i++) {
        float f = from_bits(rnd32());
        if (!isfinite(f)) continue;
        check_one(f);
    }
}
END_TEST

START_TEST(test_f32_random_values_round_trip) {
    /* the range attention outputs live in */
    for (int i = 0; i < 150000; i++) {
        float f = ((float)rnd32() / 4294967296.0f - 0.5f) * 8.0f;
        check_one(f);
    }
}
END_TEST

START_TEST(test_f32_nonfinite_written_as_zero) {
    char buf[F32_TEXT_MAX];
    ck_assert_uint_eq(fmt_f32(buf, NAN), 1);
    ck_assert_int_eq(buf[0], '0');
    ck_assert_uint_eq(fmt_f32(buf, -INFINITY), 1);
    ck_assert_int_eq(buf[0], '0');
}
END_TEST

START_TEST(test_sb_floats_and_tensor) {
    sbuf b;
    sb_init(&b);
    float x[6] = {1, 2.5f, -3, 0.125f, 1e-7f, 7};
    int shape[2] = {2, 3};
    sb_tensor_json(&b, x, 2, shape);
    ck_assert_str_eq(b.p, "[[1,2.5,-3],[0.125,1.00000001e-07,7]]");
    sb_free(&b);
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
        size_t n = parse_number(ok[i], strlen(ok[i]), &v);
        ck_assert_msg(n == strlen(ok[i]), "%s: consumed %zu", ok[i], n);
        ck_assert_msg(v == ref || (isinf(v) && isinf(ref)), "%s: %.17g vs %.17g", ok[i], v, ref);
    }
    /* random decimals with 1..20 digits and exponents */
    for (int i = 0; i < 200000; i++) {
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
        ck_assert_uint_eq(parse_number(s, (size_t)k, &v), (size_t)k);
        ck_assert_msg(v == ref, "%s: %.17g vs %.17g", s, v, ref);
    }
}
END_TEST

START_TEST(test_parse_number_f32_lands_on_the_float) {
    /* float32 values as clients print them: numpy's 17 digits, %.9g, 12 digits */
    const char *fmts[] = {"%.17g", "%.9g", "%.12g", "%.17e"};
    for (int i = 0; i < 200000; i++) {
        float f = from_bits(rnd32());
        if (!isfinite(f)) continue;
        char s[64];
        int k = snprintf(s, sizeof(s), fmts[i % 4], (double)f);
        double v;
        ck_assert_uint_eq(parse_number_f32(s, (size_t)k, &v), (size_t)k);
        ck_assert_msg(bits((float)v) == bits(f), "%s read as %08x, was %08x", s, bits((float)v),
                      bits(f));
    }
    /* and any decimal lands within a few ulps of the exact double */
    for (int i = 0; i < 200000; i++) {
        char s[64];
        int k = snprintf(s, sizeof(s), "%u%u.%ue%d", rnd32(), rnd32(), rnd32(),
                         (int)(rnd32() % 60) - 45);
        double v, ref = strtod(s, NULL);
        ck_assert_uint_eq(parse_number_f32(s, (size_t)k, &v), (size_t)k);
        ck_assert_msg(fabs(v - ref) <= 4 * fabs(ref) * DBL_EPSILON, "%s: %.17g vs %.17g", s, v,
                      ref);
    }
}
END_TEST

START_TEST(test_parse_number_refuses_bad_grammar) {
    const char *bad[] = {"-",    ".5", "+1",  "e5",  "-.5",      "1.",
                         "1.e5", "1e", "1e+", "NaN", "Infinity", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        double v;
        size_t n = parse_number(bad[i], strlen(bad[i]), &v);
        ck_assert_msg(n == 0, "'%s' was read (%zu bytes)", bad[i], n);
    }
    double v;
    /* a leading zero ends the number: the reader then sees "1" as trailing garbage */
    ck_assert_uint_eq(parse_number("01", 2, &v), 1);
}
END_TEST

START_TEST(test_b64_vectors) {
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        sbuf b;
        sb_init(&b);
        sb_b64(&b, plain[i], strlen(plain[i]));
        sb_putc(&b, '\0');
        ck_assert_str_eq(b.p, enc[i]);
        sb_free(&b);
        char out[16];
        size_t n = 99;
        ck_assert_int_eq(b64_decode(enc[i], strlen(enc[i]), out, sizeof(out), &n), 0);
        ck_assert_uint_eq(n, strlen(plain[i]));
        ck_assert(memcmp(out, plain[i], n) == 0);
    }
    /* unpadded is accepted too */
    char out[16];
    size_t n = 0;
    ck_assert_int_eq(b64_decode("Zm9vYg", 6, out, sizeof(out), &n), 0);
    ck_assert_uint_eq(n, 4);
}
END_TEST

START_TEST(test_b64_refuses_garbage) {
    const char *bad[] = {"Zm9v!", "Z", "Zm9 v", "Zm=v", "Zm9v\n", "====", "Zg=a"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char out[16];
        size_t n;
        ck_assert_msg(b64_decode(bad[i], strlen(bad[i]), out, sizeof(out), &n) < 0,
                      "'%s' was decoded", bad[i]);
    }
    char small[2];
    size_t n;
    ck_assert_int_lt(b64_decode("Zm9v", 4, small, sizeof(small), &n), 0);
}
END_TEST

START_TEST(test_b64_random_round_trip) {
    for (int len = 0; len < 300; len++) {
        unsigned char in[300], out[300];
        for (int i = 0; i < len; i++)
            in[i] = (unsigned char)rnd32();
        sbuf b;
        sb_init(&b);
        sb_b64(&b, in, (size_t)len);
        ck_assert_uint_eq(b.len, (size_t)(len + 2) / 3 * 4);
        size_t n = 0;
        ck_assert_int_eq(b64_decode(b.p ? b.p : "", b.len, out, sizeof(out), &n), 0);
        ck_assert_uint_eq(n, (size_t)len);
        ck_assert(memcmp(in, out, n) == 0);
        sb_free(&b);
    }
}
END_TEST

START_TEST(test_json_str_escapes) {
    sbuf b;
    sb_init(&b);
    sb_json_str(&b, "a\"b\\c\nd\x01");
    ck_assert_str_eq(b.p, "\"a\\\"b\\\\c\\nd\\u0001\"");
    sb_free(&b);
    /* not UTF-8 (a lone 0xff, a cut sequence, an overlong slash) -> U+FFFD; valid kept */
    sb_init(&b);
    sb_json_str(&b, "m\xff\xc3\xa9\xe2\x82\xc0\xaf");
    ck_assert_str_eq(b.p, "\"m\\ufffd\xc3\xa9\\ufffd\\ufffd\\ufffd\\ufffd\"");
    sb_free(&b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_codec");
    TCase *tc = tcase_create("codec");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_f32_special_values);
    tcase_add_test(tc, test_f32_random_bits_round_trip);
    tcase_add_test(tc, test_f32_random_values_round_trip);
    tcase_add_test(tc, test_f32_nonfinite_written_as_zero);
    tcase_add_test(tc, test_sb_floats_and_tensor);
    tcase_add_test(tc, test_parse_number_matches_strtod);
    tcase_add_test(tc, test_parse_number_refuses_bad_grammar);
    tcase_add_test(tc, test_parse_number_f32_lands_on_the_float);
    tcase_add_test(tc, test_b64_vectors);
    tcase_add_test(tc, test_b64_refuses_garbage);
    tcase_add_test(tc, test_b64_random_round_trip);
    tcase_add_test(tc, test_json_str_escapes);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
