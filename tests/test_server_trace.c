/* test_server_trace.c - W3C Trace Context (server/obs/trace.c): traceparent
 * of version 00 and of future versions, every malformed form refused and a
 * new trace started in its place, tracestate kept, cleaned, refused and
 * trimmed to the spec's limits, random ids never zero and never repeated,
 * and the answer's traceparent.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/obs/trace.h"
#include "check_run.h"

#define TRACE "4bf92f3577b34da6a3ce929d0e0e4736"
#define PARENT "00f067aa0ba902b7"

static int parse(const char *s, uint8_t tid[16], uint8_t pid[8], uint8_t *flags, char *err) {
    return attnd_traceparent_parse(s, strlen(s), tid, pid, flags, err, 200);
}

/* Refused, with a sentence that holds `why`. */
static void refused(const char *s, const char *why) {
    uint8_t tid[16], pid[8], flags;
    char err[200] = "";
    ck_assert_msg(parse(s, tid, pid, &flags, err) == -1, "accepted \"%s\"", s);
    ck_assert_msg(strstr(err, why) != NULL, "\"%s\": error \"%s\" lacks \"%s\"", s, err, why);
}

START_TEST(test_parse_version_00) {
    uint8_t tid[16], pid[8], flags = 0xee;
    char hex[33];
    ck_assert_int_eq(parse("00-" TRACE "-" PARENT "-01", tid, pid, &flags, NULL), 0);
    attnd_hex(hex, tid, 16);
    ck_assert_str_eq(hex, TRACE);
    attnd_hex(hex, pid, 8);
    ck_assert_str_eq(hex, PARENT);
    ck_assert_int_eq(flags, ATTND_TRACE_SAMPLED);
    ck_assert_int_eq(parse("00-" TRACE "-" PARENT "-00", tid, pid, &flags, NULL), 0);
    ck_assert_int_eq(flags, 0);
    /* Bits other than sampled are not Level 1's: cleared. */
    ck_assert_int_eq(parse("00-" TRACE "-" PARENT "-ff", tid, pid, &flags, NULL), 0);
    ck_assert_int_eq(flags, ATTND_TRACE_SAMPLED);
    ck_assert_int_eq(parse("00-" TRACE "-" PARENT "-08", tid, pid, &flags, NULL), 0);
    ck_assert_int_eq(flags, 0);
}
END_TEST

START_TEST(test_parse_future_versions) {
    uint8_t tid[16], pid[8], flags;
    char hex[33];
    /* A higher version: its first 55 characters read as 00, the rest after '-' ignored. */
    ck_assert_int_eq(parse("01-" TRACE "-" PARENT "-01", tid, pid, &flags, NULL), 0);
    ck_assert_int_eq(flags, 1);
    ck_assert_int_eq(
        parse("cc-" TRACE "-" PARENT "-01-what-the-future-holds", tid, pid, &flags, NULL), 0);
    attnd_hex(hex, tid, 16);
    ck_assert_str_eq(hex, TRACE);
    ck_assert_int_eq(flags, 1);
    ck_assert_int_eq(parse("fe-" TRACE "-" PARENT "-02-x", tid, pid, &flags, NULL), 0);
    ck_assert_int_eq(flags, 0);
    refused("cc-" TRACE "-" PARENT "-01.what", "55");    /* not '-' after the flags */
    refused("cc-" TRACE "-" PARENT "-0", "55");          /* shorter than 55 */
    refused("ff-" TRACE "-" PARENT "-01", "version ff"); /* ff is never valid */
}
END_TEST

START_TEST(test_parse_refusals) {
    refused("", "version");
    refused("0", "version");
    refused("0x-" TRACE "-" PARENT "-01", "version");
    refused("0A-" TRACE "-" PARENT "-01", "version");
    refused("00-" TRACE "-" PARENT "-01-", "55"); /* version 00 has exactly 55 */
    refused("00-" TRACE "-" PARENT "-01 ", "55"); /* trailing space */
    refused("00-" TRACE "-" PARENT "-1", "55");   /* short flags */
    refused("00-" TRACE "0-" PARENT "-1", "'-'"); /* long trace id, right length */
    refused("00-" TRACE "-" PARENT "0-1", "'-'"); /* long parent id */
    refused("00_" TRACE "-" PARENT "-01", "'-'"); /* wrong separator */
    refused("00-" TRACE "-" PARENT "_01", "'-'"); /* wrong separator */
    refused("00-4BF92F3577B34DA6A3CE929D0E0E4736-" PARENT "-01", "trace-id"); /* uppercase */
    refused("00-4bf92f3577b34da6a3ce929d0e0e473g-" PARENT "-01", "trace-id"); /* not hex */
    refused("00-" TRACE "-00F067AA0BA902B7-01", "parent-id");                 /* uppercase */
    refused("00-" TRACE "-00f067aa0ba902bz-01", "parent-id");                 /* not hex */
    refused("00-" TRACE "-" PARENT "-0A", "trace-flags");                     /* uppercase */
    refused("00-" TRACE "-" PARENT "-0g", "trace-flags");                     /* not hex */
    refused("00-00000000000000000000000000000000-" PARENT "-01", "trace-id is all zeros");
    refused("00-" TRACE "-0000000000000000-01", "parent-id is all zeros");
}
END_TEST

START_TEST(test_start_continues_or_restarts) {
    attnd_trace t;
    char tp[ATTND_TRACEPARENT_LEN + 1], hex[33];
    attnd_trace_start(&t, "00-" TRACE "-" PARENT "-01", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
    ck_assert_int_eq(t.has_parent, 1);
    attnd_hex(hex, t.parent_id, 8);
    ck_assert_str_eq(hex, PARENT);
    ck_assert_str_eq(t.tracestate, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
    attnd_traceparent_format(&t, tp);
    ck_assert_int_eq((int)strlen(tp), ATTND_TRACEPARENT_LEN);
    ck_assert_msg(strncmp(tp, "00-" TRACE "-", 36) == 0, "%s", tp);
    ck_assert_msg(strncmp(tp + 36, PARENT, 16) != 0, "the answer carries the caller's span: %s",
                  tp);
    ck_assert_str_eq(tp + 52, "-01");
    /* Its own answer reads back as a valid traceparent with the request's span. */
    uint8_t tid[16], pid[8], flags;
    ck_assert_int_eq(parse(tp, tid, pid, &flags, NULL), 0);
    ck_assert(memcmp(pid, t.span_id, 8) == 0);
    /* Not sampled by the caller: kept so. */
    attnd_trace_start(&t, "00-" TRACE "-" PARENT "-00", NULL);
    attnd_traceparent_format(&t, tp);
    ck_assert_str_eq(tp + 52, "-00");
    ck_assert_str_eq(t.tracestate, "");
    /* A future version is answered as 00. */
    attnd_trace_start(&t, "7f-" TRACE "-" PARENT "-01-extra", NULL);
    attnd_traceparent_format(&t, tp);
    ck_assert_msg(strncmp(tp, "00-" TRACE "-", 36) == 0, "%s", tp);
}
END_TEST

START_TEST(test_start_new_trace) {
    const char *bad[] = {NULL, "", "garbage", "00-" TRACE "-0000000000000000-01",
                         "00-" TRACE "-" PARENT "-01-"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        attnd_trace t;
        char tp[ATTND_TRACEPARENT_LEN + 1];
        /* tracestate is ignored when traceparent is not valid. */
        attnd_trace_start(&t, bad[i], "congo=t61rcWkgMzE");
        ck_assert_int_eq(t.has_parent, 0);
        ck_assert_str_eq(t.tracestate, "");
        ck_assert_int_eq(t.flags, ATTND_TRACE_SAMPLED);
        attnd_traceparent_format(&t, tp);
        ck_assert_msg(strncmp(tp + 3, TRACE, 32) != 0, "case %zu kept the trace id", i);
        uint8_t tid[16], pid[8], flags;
        ck_assert_int_eq(parse(tp, tid, pid, &flags, NULL), 0);
        ck_assert_int_eq(flags, 1);
    }
}
END_TEST

static void clean_ok(const char *in, const char *want) {
    char out[ATTND_TRACESTATE_MAX + 1], err[200] = "";
    ck_assert_msg(attnd_tracestate_clean(in, strlen(in), out, err, sizeof err) == 0,
                  "\"%s\" refused: %s", in, err);
    ck_assert_msg(strcmp(out, want) == 0, "\"%s\" -> \"%s\", want \"%s\"", in, out, want);
}

static void clean_bad(const char *in, const char *why) {
    char out[ATTND_TRACESTATE_MAX + 1], err[200] = "";
    ck_assert_msg(attnd_tracestate_clean(in, strlen(in), out, err, sizeof err) == -1,
                  "\"%s\" accepted as \"%s\"", in, out);
    ck_assert_str_eq(out, "");
    ck_assert_msg(strstr(err, why) != NULL, "\"%s\": \"%s\" lacks \"%s\"", in, err, why);
}

START_TEST(test_tracestate_grammar) {
    clean_ok("", "");
    clean_ok(" , ,\t", "");
    clean_ok("a=1", "a=1");
    clean_ok(" a=1 ,\tb=2\t, ,c=x y", "a=1,b=2,c=x y");
    clean_ok("foo_bar-*/9=v", "foo_bar-*/9=v");
    clean_ok("7tenant@vendor=v,t@s=w", "7tenant@vendor=v,t@s=w");
    clean_ok("a=!\"#$%&'()*+-./:;<>?@[\\]^_`{|}~", "a=!\"#$%&'()*+-./:;<>?@[\\]^_`{|}~");
    clean_bad("a", "list-member 0");
    clean_bad("a=", "list-member 0");
    clean_bad("=1", "list-member 0");
    clean_bad("A=1", "list-member 0");       /* uppercase key */
    clean_bad("9a=1", "list-member 0");      /* a simple key starts with a letter */
    clean_bad("a=1,b=x=y", "list-member 1"); /* '=' in a value */
    clean_bad("a=1,b=tab\there", "list-member 1");
    clean_bad("a=1,b=\x7f", "list-member 1");
    clean_bad("a=1,b=\xc3\xa9", "list-member 1");
    clean_bad("a@=1", "list-member 0");  /* empty system id */
    clean_bad("a@B=1", "list-member 0"); /* system id starts with a letter */
    clean_bad("a@b@c=1", "list-member 0");
    clean_bad("a@abcdefghijklmno=1", "list-member 0"); /* system id of 15 */
    clean_bad("a=1,b=2,a=3", "given twice");
}
END_TEST

START_TEST(test_tracestate_lengths) {
    char in[8192], want[8192], key[300], val[300];
    /* 256-character simple key and value are the longest allowed. */
    memset(key, 'k', 256), key[256] = 0;
    memset(val, 'v', 256), val[256] = 0;
    snprintf(in, sizeof in, "%s=%s", key, val);
    char out[ATTND_TRACESTATE_MAX + 1];
    ck_assert_int_eq(attnd_tracestate_clean(in, strlen(in), out, NULL, 0), 0);
    ck_assert_str_eq(out, ""); /* 513 characters: one member over 128, dropped */
    snprintf(in, sizeof in, "k%s=v", key);
    clean_bad(in, "list-member 0");
    snprintf(in, sizeof in, "k=v%s", val);
    clean_bad(in, "list-member 0");
    /* 32 members are allowed, 33 are not. */
    in[0] = 0;
    for (int i = 0; i < 32; i++)
        snprintf(in + strlen(in), sizeof in - strlen(in), "%sk%d=%d", i ? "," : "", i, i);
    clean_ok(in, in);
    strcat(in, ",k32=32");
    clean_bad(in, "more than 32");
    /* Over 512: long members go first, then members from the end. */
    memset(val, 'x', 250), val[250] = 0;
    snprintf(in, sizeof in, "a=1,big=%s,c=3,d=%.100s,e=%.100s,g=%.100s", val, val, val, val);
    snprintf(want, sizeof want, "a=1,c=3,d=%.100s,e=%.100s,g=%.100s", val, val, val);
    clean_ok(in, want); /* 571 characters, 317 once "big" is gone */
    memset(val, 'y', 120), val[120] = 0;
    snprintf(in, sizeof in, "a=%s,b=%s,c=%s,d=%s,e=%s", val, val, val, val, val);
    snprintf(want, sizeof want, "a=%s,b=%s,c=%s,d=%s", val, val, val, val);
    clean_ok(in, want); /* 5 x 122 + 4 = 614; 4 x 122 + 3 = 491 */
    /* Exactly 512 is kept whole. */
    memset(val, 'z', 126), val[126] = 0;
    snprintf(in, sizeof in, "a=%.125s,b=%.125s,c=%.125s,d=%s", val, val, val, val);
    ck_assert_int_eq((int)strlen(in), 512);
    clean_ok(in, in);
}
END_TEST

static int cmp8(const void *a, const void *b) {
    return memcmp(a, b, 8);
}

START_TEST(test_random_ids) {
    enum { N = 4096 };
    static uint8_t ids[N][8];
    for (int i = 0; i < N; i++) {
        attnd_trace_random_id(ids[i], 8);
        int zero = 1;
        for (int b = 0; b < 8; b++)
            zero &= ids[i][b] == 0;
        ck_assert(!zero);
    }
    /* Every bit position takes both values. */
    uint8_t or = 0, and = 0xff;
    for (int i = 0; i < N; i++)
        or |= ids[i][3], and &= ids[i][3];
    ck_assert_int_eq(or, 0xff);
    ck_assert_int_eq(and, 0);
    qsort(ids, N, sizeof ids[0], cmp8);
    for (int i = 1; i < N; i++)
        ck_assert_msg(memcmp(ids[i], ids[i - 1], 8) != 0, "an id repeats");
    /* A one-byte id is never zero either, however often it is drawn. */
    for (int i = 0; i < 10000; i++) {
        uint8_t b;
        attnd_trace_random_id(&b, 1);
        ck_assert_int_ne(b, 0);
    }
}
END_TEST

static void *draw(void *arg) {
    uint8_t *out = arg;
    attnd_trace_random_id(out, 16);
    return NULL;
}

START_TEST(test_threads_draw_apart) {
    /* Each thread seeds its own generator: two threads never start alike. */
    enum { T = 16 };
    uint8_t ids[T][16];
    pthread_t th[T];
    for (int i = 0; i < T; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, draw, ids[i]), 0);
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < T; i++)
        for (int j = 0; j < i; j++)
            ck_assert(memcmp(ids[i], ids[j], 16) != 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("w3c");
    tcase_add_test(tc, test_parse_version_00);
    tcase_add_test(tc, test_parse_future_versions);
    tcase_add_test(tc, test_parse_refusals);
    tcase_add_test(tc, test_start_continues_or_restarts);
    tcase_add_test(tc, test_start_new_trace);
    tcase_add_test(tc, test_tracestate_grammar);
    tcase_add_test(tc, test_tracestate_lengths);
    tcase_add_test(tc, test_random_ids);
    tcase_add_test(tc, test_threads_draw_apart);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return check_run(suite());
}
