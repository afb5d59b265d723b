/* test_server_routes.c - the route table: matches, captures, 404, 405 and
 * Allow, the open routes, each row's handler, label and flags (the answer
 * kinds are test_server_kinds.c's, the metrics text test_server_metrics.c's). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/http/routes.h"
#include "check_run.h"

START_TEST(test_every_route_matches_itself) {
    for (int i = 0; i < R_COUNT; i++) {
        const attnd_route *r = &attnd_routes[i];
        ck_assert_int_eq(r->id, i);
        if (strcmp(r->pattern, "*") == 0) continue; /* the preflight: test_head_and_options */
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
        ck_assert_ptr_eq(m.path, r);
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
    ck_assert_ptr_null(m.route);
    ck_assert_int_eq(attnd_route_find("OPTIONS", "/v1/attention", 1, &m), 0);
    ck_assert_str_eq(m.allow, "POST, OPTIONS");
    /* the preflight row answers; the path's route names the request */
    ck_assert_ptr_eq(m.route, &attnd_routes[R_PREFLIGHT]);
    ck_assert_int_eq(m.path->id, R_ATTENTION);
    ck_assert_int_eq(attnd_route_find("OPTIONS", "/v2/models/m1/ready", 1, &m), 0);
    ck_assert_ptr_eq(m.route, &attnd_routes[R_PREFLIGHT]);
    ck_assert_int_eq(m.path->id, R_V2_MODEL_READY);
    ck_assert_str_eq(m.name, "m1");
    ck_assert_int_eq(attnd_route_find("OPTIONS", "/nowhere", 1, &m), 404);
    ck_assert_int_eq(attnd_route_find("OPTIONS", "*", 1, &m), 404);
    ck_assert_int_eq(attnd_route_find("GET", "*", 1, &m), 404);
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
 * the ones that compute but for the repository's (they load and unload
 * models: their bodies make no job), and those whose model the path tells
 * (or the only one) check its queue first. */
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
        int repo = i == R_REPO_INDEX || i == R_REPO_LOAD || i == R_REPO_UNLOAD;
        ck_assert_int_eq(repo, strncmp(r->pattern, "/v2/repository/", 15) == 0);
        ck_assert_int_eq((r->flags & ROUTE_COMPUTE) != 0, post && !repo);
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

int main(void) {
    Suite *s = suite_create("server_routes");
    TCase *tc = tcase_create("routes");
    tcase_add_test(tc, test_every_route_matches_itself);
    tcase_add_test(tc, test_unknown_paths_404);
    tcase_add_test(tc, test_head_and_options);
    tcase_add_test(tc, test_open_routes);
    tcase_add_test(tc, test_rows);
    suite_add_tcase(s, tc);
    return check_run(s);
}
