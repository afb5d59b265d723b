/* test_server_routes.c - the route table (matches, captures, 404, 405 and
 * Allow), the error road (kind -> status, body) and the metrics text. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/base/reply.h"
#include "../server/http/routes.h"
#include "../server/obs/metrics.h"
#include "check_run.h"

START_TEST(test_every_route_matches_itself) {
    for (int i = 0; i < R_COUNT; i++) {
        const attnd_route *r = &attnd_routes[i];
        ck_assert_int_eq(r->id, i);
        char path[256];
        const char *p = r->pattern;
        size_t k = 0;
        while (*p) { /* fill {name} with "m1" and {version} with "1" */
            if (*p == '{') {
                const char *v = strncmp(p, "{name}", 6) == 0 ? "m1" : "1";
                k += (size_t)snprintf(path + k, sizeof(path) - k, "%s", v);
                p = strchr(p, '}') + 1;
            } else {
                path[k++] = *p++;
            }
        }
        path[k] = '\0';
        attnd_route_match m;
        ck_assert_int_eq(attnd_route_find(r->method, path, 0, &m), 0);
        ck_assert_ptr_eq(m.route, r);
        if (strstr(r->pattern, "{name}")) ck_assert_str_eq(m.name, "m1");
        if (strstr(r->pattern, "{version}")) ck_assert_str_eq(m.version, "1");
        /* the other method is 405 with Allow naming the right one */
        const char *other = strcmp(r->method, "GET") == 0 ? "POST" : "GET";
        ck_assert_int_eq(attnd_route_find(other, path, 0, &m), 405);
        ck_assert_ptr_nonnull(strstr(m.allow, r->method));
        ck_assert_ptr_null(strstr(m.allow, "OPTIONS"));
    }
}
END_TEST

START_TEST(test_unknown_paths_404) {
    const char *paths[] = {"/",
                           "/v1",
                           "/v1/attention/",
                           "/health/",
                           "/v1/models/",
                           "/v2/models//infer",
                           "/v2/models/a/b/infer",
                           "/healthz",
                           "",
                           "/v2/models/a/versions//infer"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        attnd_route_match m;
        ck_assert_msg(attnd_route_find("GET", paths[i], 0, &m) == 404, "%s matched", paths[i]);
        ck_assert_msg(attnd_route_find("POST", paths[i], 0, &m) == 404, "%s matched", paths[i]);
        ck_assert_ptr_null(m.route);
    }
}
END_TEST

START_TEST(test_head_and_options) {
    attnd_route_match m;
    ck_assert_int_eq(attnd_route_find("HEAD", "/health", 0, &m), 0);
    ck_assert_int_eq(attnd_route_find("HEAD", "/v1/attention", 0, &m), 405);
    ck_assert_int_eq(attnd_route_find("OPTIONS", "/v1/attention", 0, &m), 405);
    ck_assert_int_eq(attnd_route_find("OPTIONS", "/v1/attention", 1, &m), 0);
    ck_assert_str_eq(m.allow, "POST, OPTIONS");
    ck_assert_int_eq(attnd_route_find("DELETE", "/v1/models", 1, &m), 405);
    ck_assert_str_eq(m.allow, "GET, HEAD, OPTIONS");
    ck_assert_int_eq(attnd_route_find("GET", "/v2/models/enc.0-x_y/ready", 0, &m), 0);
    ck_assert_int_eq(m.route->id, R_V2_MODEL_READY);
    ck_assert_str_eq(m.name, "enc.0-x_y");
}
END_TEST

START_TEST(test_open_routes) {
    for (int i = 0; i < R_COUNT; i++) {
        int open = i == R_HEALTH || i == R_METRICS || i == R_V2_LIVE || i == R_V2_READY ||
                   i == R_UI || i == R_UI_FILE;
        int is_open = (attnd_routes[i].flags & ROUTE_OPEN) != 0;
        ck_assert_msg(is_open == open, "%s open=%d", attnd_routes[i].pattern, is_open);
    }
}
END_TEST

/* Every row has its handler, its label is its pattern as Prometheus takes
 * it ({x} written :x; a session's {name} is its id), the POST routes are
 * the ones that compute, and those whose model the path tells (or the only
 * one) check its queue first. */
START_TEST(test_rows) {
    for (int i = 0; i < R_COUNT; i++) {
        const attnd_route *r = &attnd_routes[i];
        ck_assert_ptr_nonnull(r->handle);
        char want[256];
        size_t k = 0;
        int session = strncmp(r->pattern, "/v1/sessions/", 13) == 0;
        for (const char *p = r->pattern; *p;) {
            if (*p == '{') {
                const char *end = strchr(p, '}');
                const char *word = session ? "id" : p + 1;
                size_t n = session ? 2 : (size_t)(end - p - 1);
                want[k++] = ':';
                memcpy(want + k, word, n);
                k += n;
                p = end + 1;
            } else {
                want[k++] = *p++;
            }
        }
        want[k] = '\0';
        ck_assert_str_eq(r->label, want);
        ck_assert_str_eq(attnd_route_label((attnd_route_id)i), want);
        int post = strcmp(r->method, "POST") == 0;
        ck_assert_int_eq((r->flags & ROUTE_COMPUTE) != 0, post);
        int first =
            i == R_ATTENTION || i == R_MODEL_ATTENTION || i == R_V2_INFER || i == R_V2_VINFER;
        ck_assert_int_eq((r->flags & ROUTE_QUEUE_FIRST) != 0, first);
    }
    ck_assert_str_eq(attnd_route_label(R_UNKNOWN), "unknown");
    /* one handler serves a route and its versions/{version} twin */
    ck_assert_ptr_eq(attnd_routes[R_V2_INFER].handle, attnd_routes[R_V2_VINFER].handle);
    ck_assert_ptr_eq(attnd_routes[R_ATTENTION].handle, attnd_routes[R_MODEL_ATTENTION].handle);
}
END_TEST

START_TEST(test_error_statuses_and_body) {
    int want[ATTND_KINDS] = {200, 201, 204, 204, 304, 400, 401, 404,
                             405, 413, 429, 500, 503, 504, 409};
    for (int i = 0; i < ATTND_KINDS; i++) {
        ck_assert_int_eq(attnd_kind_status((attnd_kind)i), want[i]);
        ck_assert_int_eq(attnd_kind_is_error((attnd_kind)i), want[i] >= 400);
    }
    /* the headers hang on the kind */
    ck_assert_uint_eq(attnd_kind_headers(AERR_METHOD), ATTND_HDR_ALLOW);
    ck_assert_uint_eq(attnd_kind_headers(AERR_UNAUTHORIZED), ATTND_HDR_AUTHENTICATE);
    ck_assert_uint_eq(attnd_kind_headers(AERR_QUEUE_FULL), ATTND_HDR_RETRY_AFTER);
    ck_assert_uint_eq(attnd_kind_headers(AERR_UNAVAILABLE), ATTND_HDR_RETRY_AFTER);
    ck_assert_uint_eq(attnd_kind_headers(AOK_NO_CONTENT), ATTND_HDR_ALLOW);
    ck_assert_uint_eq(attnd_kind_headers(AOK_PREFLIGHT), ATTND_HDR_ALLOW | ATTND_HDR_PREFLIGHT);
    ck_assert_uint_eq(attnd_kind_headers(AOK), 0);
    ck_assert_uint_eq(attnd_kind_headers(AOK_UNCHANGED), 0);
    ck_assert_uint_eq(attnd_kind_headers(AERR_BAD_REQUEST), 0);
    size_t n = 0;
    char *b = attnd_error_body("query[2][5]: not a \"number\"", &n);
    ck_assert_str_eq(b, "{\"error\":\"query[2][5]: not a \\\"number\\\"\"}\n");
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
    attnd_reply_free(&a);
    ck_assert_ptr_null(a.body);
}
END_TEST

START_TEST(test_metrics_text) {
    static attnd_metrics m;
    const char *labels[R_COUNT + 1];
    attnd_route_labels(labels);
    attnd_metrics_init(&m, labels, R_COUNT + 1);
    attnd_metrics_request(&m, R_ATTENTION, 200, 1500);
    attnd_metrics_request(&m, R_ATTENTION, 200, 2400000);
    attnd_metrics_request(&m, R_V2_INFER, 429, 10);
    attnd_metrics_reject(&m, AERR_QUEUE_FULL);
    attnd_metrics_reject(&m, AERR_TIMEOUT);
    attnd_hist_observe(&m.batch_size, 3);
    attnd_sbuf b;
    attnd_sb_init(&b);
    const char *names[1] = {"default"};
    int depth[1] = {7};
    attnd_metrics_write(&m, &b, names, depth, 1);
    const char *want[] = {
        "attnd_requests_total{route=\"/v1/attention\",status=\"200\"} 2\n",
        "attnd_requests_total{route=\"/v2/models/:name/infer\",status=\"429\"} 1\n",
        "attnd_request_duration_seconds_bucket{le=\"0.0025\"} 2\n",
        "attnd_request_duration_seconds_bucket{le=\"2.5\"} 3\n",
        "attnd_request_duration_seconds_bucket{le=\"+Inf\"} 3\n",
        "attnd_request_duration_seconds_count 3\n",
        "attnd_request_duration_seconds_sum 2.40151\n",
        "attnd_batch_size_bucket{le=\"2\"} 0\n",
        "attnd_batch_size_bucket{le=\"4\"} 1\n",
        "attnd_queue_depth{model=\"default\"} 7\n",
        "attnd_rejected_total{reason=\"queue_full\"} 1\n",
        "attnd_timeouts_total 1\n",
        "# TYPE attnd_compute_seconds histogram\n",
        "# TYPE attnd_tokens_total counter\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ck_assert_msg(strstr(b.p, want[i]), "missing %s", want[i]);
    attnd_sb_free(&b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_routes");
    TCase *tc = tcase_create("routes");
    tcase_add_test(tc, test_every_route_matches_itself);
    tcase_add_test(tc, test_unknown_paths_404);
    tcase_add_test(tc, test_head_and_options);
    tcase_add_test(tc, test_open_routes);
    tcase_add_test(tc, test_rows);
    tcase_add_test(tc, test_error_statuses_and_body);
    tcase_add_test(tc, test_metrics_text);
    suite_add_tcase(s, tc);
    return check_run(s);
}
