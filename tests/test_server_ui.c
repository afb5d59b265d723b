/* test_server_ui.c - the viewer's embedded files (server/ui/ui.c): each is the
 * file of server/ui/ byte for byte, with its type, an ETag that follows its
 * bytes, the conditional GET and the headers every answer of it carries. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/ui/ui.h"
#include "check_run.h"

/* The whole file at path (run from the repository's root), or NULL. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
        rewind(f);
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
            *len = (size_t)n;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

START_TEST(test_files_are_the_tree_s) {
    const struct {
        const char *name, *path, *type;
    } want[] = {
        {"", "server/ui/index.html", "text/html; charset=utf-8"},
        {"app.js", "server/ui/app.js", "text/javascript; charset=utf-8"},
        {"style.css", "server/ui/style.css", "text/css; charset=utf-8"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const attnd_ui_file *f = attnd_ui_find(want[i].name);
        ck_assert_ptr_nonnull(f);
        ck_assert_str_eq(f->type, want[i].type);
        size_t n = 0;
        char *disk = slurp(want[i].path, &n);
        ck_assert_msg(disk != NULL, "cannot read %s (run from the repository's root)",
                      want[i].path);
        ck_assert_uint_eq(f->len, n);
        ck_assert_msg(memcmp(f->data, disk, n) == 0, "%s differs from the embedded copy",
                      want[i].path);
        free(disk);
        ck_assert_uint_eq(strlen(f->etag), 18);
        ck_assert_int_eq(f->etag[0], '"');
        ck_assert_int_eq(f->etag[17], '"');
    }
    /* the page never starts as libmicrohttpd's error pages do (server/http/send.c) */
    ck_assert_int_ne(strncmp(attnd_ui_find("")->data, "<html>", 6), 0);
    /* distinct bytes, distinct tags */
    ck_assert_str_ne(attnd_ui_find("")->etag, attnd_ui_find("app.js")->etag);
    ck_assert_str_ne(attnd_ui_find("app.js")->etag, attnd_ui_find("style.css")->etag);
}
END_TEST

START_TEST(test_unknown_names) {
    const char *names[] = {"index.html", "app", "app.js/", "../app.js", "APP.JS", "x", "ui"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ck_assert_msg(attnd_ui_find(names[i]) == NULL, "'%s' found", names[i]);
}
END_TEST

START_TEST(test_conditional_get) {
    const attnd_ui_file *f = attnd_ui_find("app.js");
    char list[128], weak[64], other[64];
    snprintf(list, sizeof list, "\"0000000000000000\", %s", f->etag);
    snprintf(weak, sizeof weak, "W/%s", f->etag);
    snprintf(other, sizeof other, "%s", attnd_ui_find("style.css")->etag);
    ck_assert_int_eq(attnd_ui_fresh(f, f->etag), 1);
    ck_assert_int_eq(attnd_ui_fresh(f, list), 1);
    ck_assert_int_eq(attnd_ui_fresh(f, weak), 1);
    ck_assert_int_eq(attnd_ui_fresh(f, " * "), 1);
    ck_assert_int_eq(attnd_ui_fresh(f, NULL), 0);
    ck_assert_int_eq(attnd_ui_fresh(f, ""), 0);
    ck_assert_int_eq(attnd_ui_fresh(f, other), 0);
    ck_assert_int_eq(attnd_ui_fresh(f, "*x"), 0);
    /* the tag's digits without its quotes name nothing */
    ck_assert_int_eq(attnd_ui_fresh(f, f->etag + 1), 0);
}
END_TEST

START_TEST(test_headers) {
    const attnd_ui_file *f = attnd_ui_find("");
    const char *name, *value, *csp = NULL, *cache = NULL, *etag = NULL;
    int n = 0;
    while (attnd_ui_header(f, n, &name, &value)) {
        if (strcmp(name, "Content-Security-Policy") == 0) csp = value;
        if (strcmp(name, "Cache-Control") == 0) cache = value;
        if (strcmp(name, "ETag") == 0) etag = value;
        n++;
    }
    ck_assert_int_ge(n, 3);
    ck_assert_int_eq(attnd_ui_header(f, -1, &name, &value), 0);
    ck_assert_ptr_nonnull(csp);
    ck_assert_int_eq(strncmp(csp, "default-src 'self';", 19), 0);
    ck_assert_ptr_null(strstr(csp, "unsafe"));
    ck_assert_str_eq(cache, "no-cache");
    ck_assert_str_eq(etag, f->etag);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_ui");
    TCase *tc = tcase_create("ui");
    tcase_add_test(tc, test_files_are_the_tree_s);
    tcase_add_test(tc, test_unknown_names);
    tcase_add_test(tc, test_conditional_get);
    tcase_add_test(tc, test_headers);
    suite_add_tcase(s, tc);
    return check_run(s);
}
