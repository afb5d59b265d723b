/* test_server_kinds.c - the answer kinds: every kind's status, reason and
 * headers (server/base/reply.c, server/http/status.c), the headers every
 * answer carries and those a kind, CORS, a v2 binary answer or a closing
 * connection add, in the list send.c puts on the wire; refusals made and
 * answered, with their {"error": "..."} body. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/base/reply.h"
#include "../server/http/status.h"
#include "check_run.h"

/* Every kind, with what it must say. */
static const struct {
    attnd_kind kind;
    int status;
    const char *reason;
    unsigned headers;
} KINDS[] = {
    {AOK, 200, "none", 0},
    {AOK_CREATED, 201, "none", 0},
    {AOK_NO_CONTENT, 204, "none", ATTND_HDR_ALLOW},
    {AOK_PREFLIGHT, 204, "none", ATTND_HDR_ALLOW | ATTND_HDR_PREFLIGHT},
    {AOK_UNCHANGED, 304, "none", 0},
    {AERR_BAD_REQUEST, 400, "bad_request", 0},
    {AERR_UNAUTHORIZED, 401, "unauthorized", ATTND_HDR_AUTHENTICATE},
    {AERR_NOT_FOUND, 404, "not_found", 0},
    {AERR_METHOD, 405, "method", ATTND_HDR_ALLOW},
    {AERR_TOO_LARGE, 413, "too_large", 0},
    {AERR_QUEUE_FULL, 429, "queue_full", ATTND_HDR_RETRY_AFTER},
    {AERR_INTERNAL, 500, "internal", 0},
    {AERR_UNAVAILABLE, 503, "unavailable", ATTND_HDR_RETRY_AFTER},
    {AERR_TIMEOUT, 504, "timeout", 0},
    {AERR_CONFLICT, 409, "conflict", 0},
    {AERR_FORBIDDEN, 403, "forbidden", 0},
    {AERR_NO_ROOM, 507, "no_room", 0},
};

START_TEST(test_every_kind) {
    ck_assert_int_eq((int)(sizeof KINDS / sizeof KINDS[0]), ATTND_KINDS);
    for (int i = 0; i < ATTND_KINDS; i++) {
        attnd_kind k = KINDS[i].kind;
        ck_assert_int_eq(k, i);
        ck_assert_int_eq(attnd_kind_status(k), KINDS[i].status);
        ck_assert_str_eq(attnd_kind_reason(k), KINDS[i].reason);
        ck_assert_uint_eq(attnd_kind_headers(k), KINDS[i].headers);
        ck_assert_int_eq(attnd_kind_is_error(k), KINDS[i].status >= 400);
    }
    /* anything out of range is an internal failure */
    ck_assert_int_eq(attnd_kind_status((attnd_kind)ATTND_KINDS), 500);
    ck_assert_str_eq(attnd_kind_reason((attnd_kind)-1), "internal");
    ck_assert(attnd_kind_is_error((attnd_kind)99));
}
END_TEST

/* The value of header name among n, or NULL. */
static const char *find(const attnd_header *h, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(h[i].name, name) == 0) return h[i].value;
    return NULL;
}

/* Each kind's headers as send.c lists them: those of every answer, and
 * the kind's own. */
START_TEST(test_headers_of_every_kind) {
    for (int i = 0; i < ATTND_KINDS; i++) {
        attnd_kind k = KINDS[i].kind;
        attnd_answer_meta m = {.extra = attnd_kind_headers(k),
                               .ctype = "application/json",
                               .request_id = "rid-1",
                               .queue_ms = 1.5,
                               .compute_ms = 2,
                               .total_ms = 4.25,
                               .allow = "GET, HEAD",
                               .retry_after = 7};
        attnd_header h[ATTND_HEADERS_MAX];
        int n = attnd_answer_headers(&m, h), pre = k == AOK_PREFLIGHT;
        ck_assert_str_eq(find(h, n, "X-Request-Id"), "rid-1");
        ck_assert_str_eq(find(h, n, "Content-Type"), "application/json");
        ck_assert_str_eq(find(h, n, "Server-Timing"),
                         "queue;dur=1.500, compute;dur=2.000, total;dur=4.250");
        ck_assert_int_eq(find(h, n, "Cache-Control") != NULL, !pre);
        const char *allow = find(h, n, "Allow"), *retry = find(h, n, "Retry-After");
        ck_assert_int_eq(allow != NULL, k == AOK_NO_CONTENT || pre || k == AERR_METHOD);
        if (allow) ck_assert_str_eq(allow, "GET, HEAD");
        ck_assert_int_eq(find(h, n, "WWW-Authenticate") != NULL, k == AERR_UNAUTHORIZED);
        ck_assert_int_eq(retry != NULL, k == AERR_QUEUE_FULL || k == AERR_UNAVAILABLE);
        if (retry) ck_assert_str_eq(retry, "7");
        ck_assert_ptr_null(find(h, n, "Connection"));
        ck_assert_ptr_null(find(h, n, "Vary"));
        ck_assert_ptr_null(find(h, n, "Access-Control-Allow-Origin"));
    }
}
END_TEST

/* CORS on: Vary always, the origin's headers when it is allowed (a
 * preflight's own, or what a page may read); a v2 binary answer's JSON
 * length; Connection: close; Retry-After of 0 seconds is 1. */
START_TEST(test_cors_binary_close) {
    attnd_header h[ATTND_HEADERS_MAX];
    attnd_answer_meta m = {.extra = attnd_kind_headers(AOK_PREFLIGHT),
                           .request_id = "r",
                           .cors = 1,
                           .origin = "http://app.example",
                           .allow = "POST, OPTIONS"};
    int n = attnd_answer_headers(&m, h);
    ck_assert_ptr_null(find(h, n, "Content-Type")); /* an empty body */
    ck_assert_str_eq(find(h, n, "Vary"), "Origin");
    ck_assert_str_eq(find(h, n, "Access-Control-Allow-Origin"), "http://app.example");
    ck_assert_str_eq(find(h, n, "Access-Control-Allow-Methods"), "POST, OPTIONS");
    ck_assert_str_eq(find(h, n, "Access-Control-Max-Age"), "600");
    ck_assert_ptr_nonnull(find(h, n, "Access-Control-Allow-Headers"));
    ck_assert_ptr_null(find(h, n, "Access-Control-Expose-Headers"));
    m = (attnd_answer_meta){.extra = attnd_kind_headers(AERR_QUEUE_FULL),
                            .ctype = "application/octet-stream",
                            .request_id = "r",
                            .cors = 1,
                            .origin = "http://app.example",
                            .json_len = 123,
                            .close = 1};
    n = attnd_answer_headers(&m, h);
    ck_assert_str_eq(find(h, n, "Access-Control-Expose-Headers"),
                     "X-Request-Id, traceparent, Server-Timing, Retry-After, X-Session-Id");
    ck_assert_ptr_null(find(h, n, "Access-Control-Allow-Methods"));
    ck_assert_ptr_null(find(h, n, "X-Session-Id")); /* no session's answer */
    m.session_id = "00112233445566778899aabbccddeeff";
    n = attnd_answer_headers(&m, h);
    ck_assert_str_eq(find(h, n, "X-Session-Id"), "00112233445566778899aabbccddeeff");
    m.session_id = NULL;
    n = attnd_answer_headers(&m, h);
    ck_assert_str_eq(find(h, n, "Inference-Header-Content-Length"), "123");
    ck_assert_str_eq(find(h, n, "Connection"), "close");
    ck_assert_str_eq(find(h, n, "Retry-After"), "1");
    ck_assert_int_le(n, ATTND_HEADERS_MAX);
}
END_TEST

START_TEST(test_refusals_and_replies) {
    size_t n = 0;
    char *b = attnd_error_body("query[2][5]: not a \"number\"\n\x01", &n);
    ck_assert_str_eq(b, "{\"error\":\"query[2][5]: not a \\\"number\\\"\\n\\u0001\"}\n");
    ck_assert_uint_eq(n, strlen(b));
    free(b);
    attnd_error e;
    ck_assert_int_eq(attnd_set_error(&e, AERR_TOO_LARGE, "%d > %d", 5, 4), -1);
    ck_assert_int_eq(e.code, AERR_TOO_LARGE);
    ck_assert_str_eq(e.msg, "5 > 4");
    /* a refusal answered: its kind and its body, the old body freed */
    attnd_reply a = {0};
    attnd_reply_set(&a, AOK, strdup("{}"), 2, 0);
    attnd_reply_error(&a, &e);
    ck_assert_int_eq(a.kind, AERR_TOO_LARGE);
    ck_assert_str_eq(a.body, "{\"error\":\"5 > 4\"}\n");
    ck_assert_uint_eq(a.len, strlen(a.body));
    /* a protocol's members go first, and "error" stays (the v2 readiness 503) */
    attnd_set_error(&e, AERR_UNAVAILABLE, "draining");
    attnd_reply_error_with(&a, &e, "\"name\":\"m\",\"ready\":false");
    ck_assert_int_eq(a.kind, AERR_UNAVAILABLE);
    ck_assert_str_eq(a.body, "{\"name\":\"m\",\"ready\":false,\"error\":\"draining\"}\n");
    ck_assert_uint_eq(a.len, strlen(a.body));
    attnd_reply_error_with(&a, &e, NULL);
    ck_assert_str_eq(a.body, "{\"error\":\"draining\"}\n");
    /* a borrowed body is handed over, never freed by the reply */
    static const char health[] = "{\"status\":\"ok\"}\n";
    attnd_reply_borrow(&a, AOK, health, sizeof health - 1);
    ck_assert(a.borrowed);
    ck_assert_ptr_eq(attnd_reply_take(&a), health);
    ck_assert_ptr_null(a.body);
    attnd_reply_free(&a);
    ck_assert_int_eq(a.kind, AOK);
    ck_assert_int_eq(a.borrowed, 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_kinds");
    TCase *tc = tcase_create("kinds");
    tcase_add_test(tc, test_every_kind);
    tcase_add_test(tc, test_headers_of_every_kind);
    tcase_add_test(tc, test_cors_binary_close);
    tcase_add_test(tc, test_refusals_and_replies);
    suite_add_tcase(s, tc);
    return check_run(s);
}
