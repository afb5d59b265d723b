/* test_server_log.c - the log lines (server/obs/log.c) as they reach
 * stdout and stderr: text and JSON forms of a message and of an access
 * line, the UTC timestamp with milliseconds, the levels (the least one
 * written, errors to stderr), the access log switched off, and escaping:
 * quotes, control characters and bytes that are not UTF-8 still make one
 * valid JSON object per line. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../server/obs/log.h"
#include "check_run.h"

/* What fn wrote to stdout (out) and stderr (err), each up to cap bytes. */
static void capture(void (*fn)(void), char *out, char *err, size_t cap) {
    FILE *fo = tmpfile(), *fe = tmpfile();
    ck_assert(fo && fe);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    fn();
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    FILE *f[2] = {fo, fe};
    char *dst[2] = {out, err};
    for (int i = 0; i < 2; i++) {
        rewind(f[i]);
        size_t n = fread(dst[i], 1, cap - 1, f[i]);
        dst[i][n] = '\0';
        fclose(f[i]);
    }
}

/* "2026-11-23T18:40:00.123Z": the shape of a timestamp. */
static int is_timestamp(const char *s) {
    static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ";
    for (size_t i = 0; i < sizeof shape - 1; i++)
        if (shape[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != shape[i]) return 0;
    return 1;
}

#define TRACE_ID "4bf92f3577b34da6a3ce929d0e0e4736"
#define SPAN_ID "00f067aa0ba902b7"
static const attnd_access ACCESS = {"POST", "/v1/attention", 200,  1234,     5.25,
                                    3,      "rid-7",         "ok", TRACE_ID, SPAN_ID};

static void write_text(void) {
    attnd_log_setup("text", "info", 1);
    attnd_log(LOG_DEBUG, "not shown");
    attnd_log(LOG_INFO, "model %s: embed_dim=%d", "default", 512);
    attnd_log(LOG_ERROR, "attnd: %s", "bad config");
    attnd_log_access(&ACCESS);
}

START_TEST(test_text_lines) {
    static char out[4096], err[4096];
    capture(write_text, out, err, sizeof out);
    ck_assert_msg(is_timestamp(out), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, " info model default: embed_dim=512\n"));
    ck_assert_ptr_null(strstr(out, "not shown"));
    ck_assert_ptr_null(strstr(out, "bad config")); /* errors go to stderr */
    ck_assert_ptr_nonnull(strstr(out, " info method=POST path=/v1/attention status=200 "
                                      "bytes=1234 ms=5.250 batch=3 id=rid-7 trace_id=" TRACE_ID
                                      " span_id=" SPAN_ID " end=ok\n"));
    ck_assert_msg(is_timestamp(err), "%s", err);
    ck_assert_str_eq(err + 24, " error attnd: bad config\n");
}
END_TEST

static void write_json(void) {
    attnd_log_setup("json", "debug", 1);
    attnd_log(LOG_DEBUG, "quote \" backslash \\ tab \t bell \x07 bad \xff\xfe end");
    attnd_log(LOG_WARN, "plain");
    attnd_access a = ACCESS;
    a.path = "/v1/\"odd\"\x01";
    a.status = 499;
    a.end = "client_gone";
    attnd_log_access(&a);
}

/* Each line of text as a JSON object; returns how many. */
static int json_lines(const char *text, json_t **objs, int cap) {
    int n = 0;
    for (const char *t = text; *t && n < cap; n++) {
        size_t k = strcspn(t, "\n");
        ck_assert_msg(t[k] == '\n', "a line without its newline");
        json_error_t je;
        objs[n] = json_loadb(t, k, 0, &je);
        ck_assert_msg(objs[n] && json_is_object(objs[n]), "not a JSON object (%s): %.*s", je.text,
                      (int)k, t);
        t += k + 1;
    }
    return n;
}

START_TEST(test_json_lines_and_escaping) {
    static char out[4096], err[4096];
    capture(write_json, out, err, sizeof out);
    ck_assert_str_eq(err, "");
    json_t *o[4];
    ck_assert_int_eq(json_lines(out, o, 4), 3);
    ck_assert(is_timestamp(json_string_value(json_object_get(o[0], "ts"))));
    ck_assert_str_eq(json_string_value(json_object_get(o[0], "level")), "debug");
    ck_assert_str_eq(json_string_value(json_object_get(o[0], "msg")),
                     "quote \" backslash \\ tab \t bell \x07 bad \xef\xbf\xbd\xef\xbf\xbd end");
    ck_assert_str_eq(json_string_value(json_object_get(o[1], "level")), "warn");
    ck_assert_str_eq(json_string_value(json_object_get(o[2], "msg")), "access");
    ck_assert_str_eq(json_string_value(json_object_get(o[2], "method")), "POST");
    ck_assert_str_eq(json_string_value(json_object_get(o[2], "path")), "/v1/\"odd\"\x01");
    ck_assert_int_eq(json_integer_value(json_object_get(o[2], "status")), 499);
    ck_assert_int_eq(json_integer_value(json_object_get(o[2], "bytes")), 1234);
    ck_assert(json_real_value(json_object_get(o[2], "ms")) == 5.25);
    ck_assert_int_eq(json_integer_value(json_object_get(o[2], "batch")), 3);
    ck_assert_str_eq(json_string_value(json_object_get(o[2], "id")), "rid-7");
    ck_assert_str_eq(json_string_value(json_object_get(o[2], "trace_id")), TRACE_ID);
    ck_assert_str_eq(json_string_value(json_object_get(o[2], "span_id")), SPAN_ID);
    ck_assert_str_eq(json_string_value(json_object_get(o[2], "end")), "client_gone");
    for (int i = 0; i < 3; i++)
        json_decref(o[i]);
}
END_TEST

static void write_quiet(void) {
    attnd_log_setup("json", "warn", 0); /* no access log; info and debug left out */
    attnd_log(LOG_INFO, "left out");
    attnd_log_access(&ACCESS);
    attnd_log(LOG_WARN, "kept");
    attnd_log_setup("xml", "loud", 1); /* words no table has: text and info */
    attnd_log(LOG_DEBUG, "left out too");
    attnd_log(LOG_INFO, "as text");
}

START_TEST(test_levels_and_access_off) {
    static char out[4096], err[4096];
    capture(write_quiet, out, err, sizeof out);
    ck_assert_ptr_null(strstr(out, "left out"));
    ck_assert_ptr_null(strstr(out, "access"));
    ck_assert_ptr_nonnull(strstr(out, "\"level\":\"warn\",\"msg\":\"kept\"}\n"));
    ck_assert_ptr_nonnull(strstr(out, "Z info as text\n"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_log");
    TCase *tc = tcase_create("log");
    tcase_add_test(tc, test_text_lines);
    tcase_add_test(tc, test_json_lines_and_escaping);
    tcase_add_test(tc, test_levels_and_access_off);
    suite_add_tcase(s, tc);
    return check_run(s);
}
