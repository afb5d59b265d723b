/* test_server_repo.c - the model repository routes' bodies
 * (server/body/repo.c): POST /v2/repository/index, .../load, .../unload.
 *
 *   index    empty, {} and {"ready": bool} read; any other field, type or
 *            body refused with a 400 naming it.
 *   load     empty, {} and {"parameters": {}} take the config file's entry;
 *            parameters.config read as a model entry into mc (its weights in
 *            the model folder); every other key, type, entry fault and path
 *            escape a 400 naming it, mc left empty.
 *   unload   empty, {} and Triton's unload_dependents read; the rest refused.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../server/body/repo.h"
#include "check_run.h"

static char g_dir[256];     /* the model folder, fresh per test */
static char g_weights[300]; /* g_dir/w.safetensors */
static char g_outside[300]; /* a weights file next to the folder, outside it */

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert(f && fputs("{}", f) >= 0 && fclose(f) == 0);
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/attnd-repo-XXXXXX");
    ck_assert(mkdtemp(g_dir) != NULL);
    snprintf(g_weights, sizeof g_weights, "%s/w.safetensors", g_dir);
    snprintf(g_outside, sizeof g_outside, "%s.outside.safetensors", g_dir);
    touch(g_weights);
    touch(g_outside);
}

static void teardown(void) {
    unlink(g_weights);
    unlink(g_outside);
    rmdir(g_dir);
}

/* ------------------------------------------------------------ index */

static int index_of(const char *body, int *ready, attnd_error *e) {
    memset(e, 0, sizeof *e);
    *ready = -1;
    return attnd_repo_parse_index(body, strlen(body), ready, e);
}

static void expect_index_refused(const char *body, const char *msg) {
    attnd_error e;
    int ready;
    ck_assert_msg(index_of(body, &ready, &e) == -1, "accepted: %s", body);
    ck_assert_int_eq(e.code, AERR_BAD_REQUEST);
    ck_assert_msg(strstr(e.msg, msg), "\"%s\" lacks \"%s\"", e.msg, msg);
}

START_TEST(index_bodies) {
    attnd_error e;
    int ready;
    const char *plain[] = {"", " \r\n\t", "{}", " {\"ready\": false} "};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        ck_assert_msg(index_of(plain[i], &ready, &e) == 0, "'%s': %s", plain[i], e.msg);
        ck_assert_int_eq(ready, 0);
    }
    ck_assert(index_of("{\"ready\":true}", &ready, &e) == 0);
    ck_assert_int_eq(ready, 1);
    expect_index_refused("{\"ready\":1}", "ready: expected true or false");
    expect_index_refused("{\"ready\":\"true\"}", "ready: expected true or false, not a string");
    expect_index_refused("{\"x\":1}", "x: unknown field (the index takes 'ready')");
    expect_index_refused("{\"ready\":true,\"ready\":true}", "body: not valid JSON");
    expect_index_refused("[]", "body: expected a JSON object, not an array");
    expect_index_refused("true", "body: expected a JSON object, not a boolean");
    expect_index_refused("ready", "body: not valid JSON (line 1");
    expect_index_refused("{} {}", "body: not valid JSON");
    /* a NUL inside the body is not white space */
    attnd_error e2 = {0};
    ck_assert(attnd_repo_parse_index(" \0 ", 3, &ready, &e2) == -1);
    ck_assert_int_eq(e2.code, AERR_BAD_REQUEST);
}
END_TEST

/* ------------------------------------------------------------ load */

static int load(const char *body, attnd_model_config *mc, int *given, attnd_error *e) {
    memset(mc, 0, sizeof *mc);
    memset(e, 0, sizeof *e);
    *given = -1;
    return attnd_repo_parse_load(body, strlen(body), "enc", g_dir, mc, given, e);
}

/* A refused load: 400 with msg; given_want 1 for an entry whose weights
 * file alone failed (a load that failed), 0 for the rest. */
static void expect_refused_as(const char *body, const char *msg, int given_want) {
    attnd_model_config mc, zero;
    attnd_error e;
    int given;
    memset(&zero, 0, sizeof zero);
    ck_assert_msg(load(body, &mc, &given, &e) == -1, "accepted: %s", body);
    ck_assert_int_eq(e.code, AERR_BAD_REQUEST);
    ck_assert_msg(strstr(e.msg, msg), "\"%s\" lacks \"%s\"", e.msg, msg);
    ck_assert_msg(e.msg[strlen(e.msg) - 1] != '.', "ends with a period: %s", e.msg);
    ck_assert_int_eq(given, given_want);
    ck_assert_msg(memcmp(&mc, &zero, sizeof mc) == 0, "a refused load holds an entry");
}

static void expect_load_refused(const char *body, const char *msg) {
    expect_refused_as(body, msg, 0);
}

START_TEST(load_without_entry) {
    attnd_model_config mc;
    attnd_error e;
    int given;
    const char *plain[] = {"", "\n", "{}", "{\"parameters\":{}}"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        ck_assert_msg(load(plain[i], &mc, &given, &e) == 0, "'%s': %s", plain[i], e.msg);
        ck_assert_int_eq(given, 0);
        ck_assert(mc.weights == NULL && mc.name[0] == '\0');
    }
}
END_TEST

START_TEST(load_with_entry) {
    attnd_model_config mc;
    attnd_error e;
    int given;
    const char *body = "{\"parameters\":{\"config\":\"{\\\"embed_dim\\\":4,\\\"num_heads\\\":2,"
                       "\\\"weights\\\":\\\"w.safetensors\\\",\\\"causal\\\":true}\"}}";
    ck_assert_msg(load(body, &mc, &given, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(given, 1);
    ck_assert_str_eq(mc.name, "enc");
    ck_assert_int_eq(mc.hp.embed_dim, 4);
    ck_assert_int_eq(mc.hp.causal, 1);
    char *real = realpath(g_weights, NULL);
    ck_assert_str_eq(mc.weights, real);
    free(real);
    attnd_model_config_free(&mc);
    /* the name may be given, equal to the path's */
    body = "{\"parameters\":{\"config\":\"{\\\"name\\\":\\\"enc\\\",\\\"embed_dim\\\":4,"
           "\\\"num_heads\\\":2,\\\"weights\\\":\\\"w.safetensors\\\"}\"}}";
    ck_assert_msg(load(body, &mc, &given, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(given, 1);
    attnd_model_config_free(&mc);
}
END_TEST

START_TEST(load_refused) {
    char body[1024];
    expect_load_refused("{\"parameters\":[]}", "parameters: expected a JSON object, not an array");
    expect_load_refused("{\"parameters\":{\"config\":{}}}", "parameters.config: expected a string");
    expect_load_refused("{\"parameters\":{\"file:x\":\"abc\"}}",
                        "parameters.file:x: unknown parameter (a load takes 'config')");
    expect_load_refused("{\"model\":\"enc\"}", "model: unknown field (a load takes 'parameters')");
    expect_load_refused("[1]", "body: expected a JSON object");
    expect_load_refused("{\"parameters\":", "body: not valid JSON");
    /* the entry's own faults, as config/ names them */
    expect_load_refused("{\"parameters\":{\"config\":\"{\\\"embed_dim\\\":\\\"4\\\"}\"}}",
                        "parameters.config: embed_dim: must be an integer");
    expect_load_refused("{\"parameters\":{\"config\":\"{\\\"embed_dim\\\":4,"
                        "\\\"num_heads\\\":2}\"}}",
                        "parameters.config: weights: missing");
    expect_load_refused("{\"parameters\":{\"config\":\"{\\\"name\\\":\\\"dec\\\"}\"}}",
                        "name: 'dec' does not match the name in the path 'enc'");
    expect_load_refused("{\"parameters\":{\"config\":\"not json\"}}",
                        "parameters.config: not valid JSON");
    /* path escapes: a 400 too */
    expect_load_refused("{\"parameters\":{\"config\":\"{\\\"embed_dim\\\":4,\\\"num_heads\\\":2,"
                        "\\\"weights\\\":\\\"../x.safetensors\\\"}\"}}",
                        "parameters.config: weights: '../x.safetensors' leaves the model folder");
    snprintf(body, sizeof body,
             "{\"parameters\":{\"config\":\"{\\\"embed_dim\\\":4,\\\"num_heads\\\":2,"
             "\\\"weights\\\":\\\"%s\\\"}\"}}",
             g_outside);
    expect_load_refused(body, "is outside the model folder");
    expect_refused_as("{\"parameters\":{\"config\":\"{\\\"embed_dim\\\":4,\\\"num_heads\\\":2,"
                      "\\\"weights\\\":\\\"missing.safetensors\\\"}\"}}",
                      "weights: cannot open 'missing.safetensors'", 1);
    /* a refusal after the parameters were read still frees the entry */
    expect_load_refused("{\"parameters\":{\"config\":\"{\\\"embed_dim\\\":4,\\\"num_heads\\\":2,"
                        "\\\"weights\\\":\\\"w.safetensors\\\",\\\"layout\\\":\\\"gpt\\\"}\"}}",
                        "parameters.config: layout: \"gpt\" must be");
}
END_TEST

/* ------------------------------------------------------------ unload */

static void expect_unload(const char *body, const char *msg) {
    attnd_error e;
    memset(&e, 0, sizeof e);
    int rc = attnd_repo_parse_unload(body, strlen(body), &e);
    if (!msg) {
        ck_assert_msg(rc == 0, "'%s': %s", body, e.msg);
        return;
    }
    ck_assert_msg(rc == -1, "accepted: %s", body);
    ck_assert_int_eq(e.code, AERR_BAD_REQUEST);
    ck_assert_msg(strstr(e.msg, msg), "\"%s\" lacks \"%s\"", e.msg, msg);
}

START_TEST(unload_bodies) {
    expect_unload("", NULL);
    expect_unload("  ", NULL);
    expect_unload("{}", NULL);
    expect_unload("{\"parameters\":{}}", NULL);
    expect_unload("{\"parameters\":{\"unload_dependents\":true}}", NULL);
    expect_unload("{\"parameters\":{\"unload_dependents\":false}}", NULL);
    expect_unload("{\"parameters\":{\"unload_dependents\":\"yes\"}}",
                  "parameters.unload_dependents: expected true or false, not a string");
    expect_unload("{\"parameters\":{\"force\":true}}",
                  "parameters.force: unknown parameter (an unload takes 'unload_dependents')");
    expect_unload("{\"parameters\":7}", "parameters: expected a JSON object, not a number");
    expect_unload("{\"x\":1}", "x: unknown field (an unload takes 'parameters')");
    expect_unload("null", "body: expected a JSON object, not null");
    expect_unload("{", "body: not valid JSON");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_repo");
    TCase *t = tcase_create("server_repo");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, index_bodies);
    tcase_add_test(t, load_without_entry);
    tcase_add_test(t, load_with_entry);
    tcase_add_test(t, load_refused);
    tcase_add_test(t, unload_bodies);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(suite());
}
