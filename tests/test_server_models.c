/* test_server_models.c - the model table (server/models/registry.c,
 * version.c, loader.c) on real weights files, without HTTP:
 *
 *   versions   the first load of a name is version 1, each load one more;
 *              attnd_models_get holds a version: it outlives a reload and
 *              an unload until its holder lets go, and is freed then (its
 *              release counted, the bytes and versions held shown by the
 *              metrics); LOAD_IF_CHANGED keeps a version whose entry and
 *              weights are the same;
 *   refusals   past max_bytes (507) and a broken weights file (400) leave
 *              the version serving as it was, and the index says why;
 *   index      READY, UNAVAILABLE, UNLOADING with their reasons (a load
 *              that fails while an unloaded version is held leaves
 *              UNLOADING);
 *   lookups    by fingerprint (an old version still held; never one whose
 *              last reference just went), the sole model;
 *   loader     load_async and load_wait on the loader thread, then stop;
 *   threads    readers getting and finding versions while another thread
 *              reloads 50 times, and getting a model whose loads fail
 *              (make tsan runs the suite under ThreadSanitizer).
 * Each test writes its weights in a folder of its own under /tmp.
 */
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../server/base/buffer.h"
#include "../server/http/status.h"
#include "../server/models/registry.h"
#include "../server/obs/log.h"
#include "check_run.h"
#include "test_models.h"
#include "test_rand.h"

static const attn_hparams HP = {.embed_dim = 8, .num_heads = 2, .kdim = 8, .vdim = 8, .bias = 1};

/* ---- files ---- */

static char g_dir[64]; /* this test's folder */
static const char *const FILES[] = {"w1", "w2", "bad"};

static void dir_new(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/attnd-test-models-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void dir_free(void) {
    char path[128];
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, FILES[i]);
        unlink(path);
    }
    rmdir(g_dir);
}

/* The path of file name in this test's folder, into path (128 bytes). */
static char *path_of(const char *name, char path[128]) {
    snprintf(path, 128, "%s/%s", g_dir, name);
    return path;
}

/* Weights of HP drawn from seed, written to file name; its path. */
static char *weights(const char *name, uint64_t seed, char path[128]) {
    attn_model m;
    char err[256];
    g_rng = seed;
    rand_model(&m, &HP, 0.5f);
    ck_assert_msg(test_weights_write(path_of(name, path), &m, err, sizeof err) == 0, "%s", err);
    attn_model_free(&m);
    return path;
}

/* A file that is no safetensors file; its path. */
static char *garbage(char path[128]) {
    FILE *f = fopen(path_of("bad", path), "wb");
    ck_assert_ptr_nonnull(f);
    fputs("these are not the weights you are looking for", f);
    fclose(f);
    return path;
}

/* ---- the table ---- */

/* Loads mc with flags: its version (the one serving after it). */
static int load(attnd_models *ms, const attnd_model_config *mc, int flags) {
    attnd_error e = {AOK, ""};
    int version = -1;
    ck_assert_msg(attnd_models_load(ms, mc, flags, &version, &e) == 0, "%s", e.msg);
    ck_assert_int_ge(version, 1);
    return version;
}

/* A load that must fail with code and a sentence holding word; version
 * untouched. */
static void load_refused(attnd_models *ms, const attnd_model_config *mc, attnd_kind code,
                         const char *word) {
    attnd_error e = {AOK, ""};
    int version = -7;
    ck_assert_int_eq(attnd_models_load(ms, mc, 0, &version, &e), -1);
    ck_assert_msg(e.code == code, "code %d, wanted %d: %s", e.code, code, e.msg);
    ck_assert_msg(strstr(e.msg, word) != NULL, "'%s' lacks '%s'", e.msg, word);
    ck_assert_int_eq(version, -7);
}

/* The version serving name, held; it must be there. */
static attnd_version *get(attnd_models *ms, const char *name) {
    attnd_error e = {AOK, ""};
    attnd_version *v = attnd_models_get(ms, name, &e);
    ck_assert_msg(v != NULL, "%s", e.msg);
    return v;
}

/* The value of an unlabelled sample of the table's metrics. */
static long long metric(attnd_models *ms, const char *name) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_models_metrics(ms, &b);
    char want[128];
    snprintf(want, sizeof want, "\n%s ", name);
    const char *at = strstr(b.p, want);
    ck_assert_msg(at != NULL, "no %s in\n%s", name, b.p);
    long long v = strtoll(at + strlen(want), NULL, 10);
    attnd_sb_free(&b);
    return v;
}

/* 1 when the table's metrics hold this whole line. */
static int has_line(attnd_models *ms, const char *line) {
    attnd_sbuf b;
    attnd_sb_init(&b);
    attnd_models_metrics(ms, &b);
    int found = strstr(b.p, line) != NULL;
    attnd_sb_free(&b);
    return found;
}

/* name's entry of the index, as a new JSON object (NULL: not listed). */
static json_t *index_entry(attnd_models *ms, const char *name, int ready_only) {
    size_t len = 0;
    char *body = attnd_models_index(ms, ready_only, &len);
    ck_assert_ptr_nonnull(body);
    ck_assert_uint_eq(len, strlen(body));
    json_error_t je;
    json_t *arr = json_loads(body, 0, &je), *hit = NULL;
    ck_assert_msg(json_is_array(arr), "%s: %s", body, je.text);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *o = json_array_get(arr, i);
        if (strcmp(json_string_value(json_object_get(o, "name")), name) == 0) hit = json_incref(o);
    }
    json_decref(arr);
    free(body);
    return hit;
}

/* name's index entry says state and version ("" when it gives none), its
 * reason holds reason ("" when it must be empty). */
static void index_says(attnd_models *ms, const char *name, const char *state, const char *version,
                       const char *reason) {
    json_t *o = index_entry(ms, name, 0);
    ck_assert_msg(o != NULL, "%s is not in the index", name);
    ck_assert_str_eq(json_string_value(json_object_get(o, "state")), state);
    json_t *v = json_object_get(o, "version");
    if (*version)
        ck_assert_str_eq(json_string_value(v), version);
    else
        ck_assert_ptr_null(v);
    const char *r = json_string_value(json_object_get(o, "reason"));
    ck_assert_ptr_nonnull(r);
    if (*reason)
        ck_assert_msg(strstr(r, reason) != NULL, "%s: reason '%s' lacks '%s'", name, r, reason);
    else
        ck_assert_str_eq(r, "");
    json_decref(o);
}

/* The references on v now. */
static int refs_of(attnd_version *v) {
    return atomic_load(&v->refs);
}

/* ---- a version's release, counted ---- */

static atomic_int g_released;
static void (*g_release)(attnd_version *v, void *arg); /* the table's */

static void counted_release(attnd_version *v, void *arg) {
    atomic_fetch_add(&g_released, 1);
    g_release(v, arg);
}

static int released(void) {
    return atomic_load(&g_released);
}

/* v's end (its last reference going) counted in g_released. */
static void count_release(attnd_version *v) {
    g_release = v->release;
    v->release = counted_release;
}

/* ---- versions ---- */

START_TEST(test_versions_count_up) {
    attnd_models *ms = attnd_models_new(0);
    char p[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    attnd_model_config n = test_model_entry("n", &HP, NULL);
    ck_assert_int_eq(load(ms, &m, 0), 1);
    ck_assert_int_eq(load(ms, &m, 0), 2);
    ck_assert_int_eq(load(ms, &n, 0), 1); /* each name counts its own */
    ck_assert_int_eq(load(ms, &m, 0), 3);
    attnd_version *v = get(ms, "m"), *w = get(ms, "n");
    ck_assert_int_eq(v->info.version, 3);
    ck_assert_str_eq(v->info.name, "m");
    ck_assert_int_eq(v->info.from_file, 1);
    ck_assert_int_eq(w->info.from_file, 0);
    ck_assert_int_eq(v->slot, 0);
    ck_assert_int_eq(w->slot, 1);
    ck_assert_int_eq(attnd_models_slot(ms, "n"), 1);
    ck_assert_int_eq(attnd_models_slot(ms, "x"), -1);
    ck_assert_int_eq(attnd_models_slots(ms), 2);
    ck_assert(has_line(ms, "attnd_model_version{model=\"m\"} 3\n"));
    ck_assert(has_line(ms, "attnd_model_loads_total{model=\"m\",result=\"ok\"} 3\n"));
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 2); /* the old ones went */
    ck_assert_int_eq(metric(ms, "attnd_model_weights_bytes"),
                     (long long)(v->info.bytes + w->info.bytes));
    char names[64];
    ck_assert_str_eq(attnd_models_names(ms, names, sizeof names), "m, n");
    index_says(ms, "m", "READY", "3", "");
    attnd_version_unref(v);
    attnd_version_unref(w);
    attnd_models_free(ms);
}
END_TEST

/* A version got is the holder's: a reload does not take it away, and its
 * memory goes with the holder's reference, not before. */
START_TEST(test_get_holds_a_reference) {
    attnd_models *ms = attnd_models_new(0);
    char p[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    load(ms, &m, 0);
    attnd_version *a = get(ms, "m");
    ck_assert_int_eq(refs_of(a), 2); /* the table's and ours */
    float first = a->model.mem[0];
    atomic_store(&g_released, 0);
    count_release(a);
    ck_assert_int_eq(load(ms, &m, 0), 2);
    attnd_version *b = get(ms, "m");
    ck_assert_ptr_ne(a, b);
    ck_assert_int_eq(refs_of(a), 1); /* ours alone */
    ck_assert_int_eq(released(), 0);
    ck_assert_int_eq(a->info.version, 1); /* whole, and its weights as loaded */
    ck_assert_float_eq(a->model.mem[0], first);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 2);
    ck_assert_int_eq(metric(ms, "attnd_model_weights_bytes"),
                     (long long)(a->info.bytes + b->info.bytes));
    attnd_version_unref(a); /* the last: freed now */
    ck_assert_int_eq(released(), 1);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 1);
    ck_assert_int_eq(metric(ms, "attnd_model_weights_bytes"), (long long)b->info.bytes);
    attnd_version_unref(b);
    attnd_models_free(ms);
}
END_TEST

/* SIGHUP's load: the same entry and the same weights keep the version;
 * other weights or another entry make a new one; a load without the flag
 * always does. */
START_TEST(test_load_if_changed) {
    attnd_models *ms = attnd_models_new(0);
    char p[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    ck_assert_int_eq(load(ms, &m, 0), 1);
    attnd_version *v1 = get(ms, "m");
    ck_assert_int_eq(load(ms, &m, LOAD_IF_CHANGED), 1);
    ck_assert_int_eq(load(ms, &m, LOAD_IF_CHANGED), 1);
    attnd_version *same = get(ms, "m");
    ck_assert_ptr_eq(same, v1);
    attnd_version_unref(same);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 1);
    ck_assert(has_line(ms, "attnd_model_loads_total{model=\"m\",result=\"ok\"} 1\n"));
    /* the file rewritten with the same weights: unchanged still */
    weights("w1", 1, p);
    ck_assert_int_eq(load(ms, &m, LOAD_IF_CHANGED), 1);
    /* other weights in the same file */
    weights("w1", 2, p);
    ck_assert_int_eq(load(ms, &m, LOAD_IF_CHANGED), 2);
    /* the same weights, another entry */
    attnd_model_config causal = m;
    causal.hp.causal = 1;
    ck_assert_int_eq(load(ms, &causal, LOAD_IF_CHANGED), 3);
    ck_assert_int_eq(load(ms, &causal, LOAD_IF_CHANGED), 3);
    ck_assert_int_eq(load(ms, &causal, 0), 4); /* no flag: a new version */
    /* the embedded default, loaded again */
    attnd_model_config d = test_model_entry("d", &HP, NULL);
    ck_assert_int_eq(load(ms, &d, 0), 1);
    ck_assert_int_eq(load(ms, &d, LOAD_IF_CHANGED), 1);
    attnd_version_unref(v1);
    attnd_models_free(ms);
}
END_TEST

/* ---- refusals ---- */

START_TEST(test_max_bytes_refused) {
    char p[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    attnd_models *probe = attnd_models_new(0);
    load(probe, &m, 0);
    attnd_version *v = get(probe, "m");
    long long bytes = (long long)v->info.bytes;
    attnd_version_unref(v);
    attnd_models_free(probe);
    /* room for one version and a half */
    attnd_models *ms = attnd_models_new(bytes + bytes / 2);
    ck_assert_int_eq(load(ms, &m, 0), 1);
    load_refused(ms, &m, AERR_NO_ROOM, "limits.max_model_bytes");
    attnd_error e = {AOK, ""};
    int version = 0;
    ck_assert_int_eq(attnd_models_load(ms, &m, 0, &version, &e), -1);
    ck_assert_int_eq(attnd_kind_status(e.code), 507);
    v = get(ms, "m"); /* the version serving keeps serving */
    ck_assert_int_eq(v->info.version, 1);
    attnd_version_unref(v);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 1);
    ck_assert_int_eq(metric(ms, "attnd_model_weights_bytes"), bytes);
    ck_assert(has_line(ms, "attnd_model_loads_total{model=\"m\",result=\"failed\"} 2\n"));
    index_says(ms, "m", "READY", "1", "limits.max_model_bytes");
    /* another model past the bound: refused, never served */
    attnd_model_config n = test_model_entry("n", &HP, p);
    load_refused(ms, &n, AERR_NO_ROOM, "limits.max_model_bytes");
    index_says(ms, "n", "UNAVAILABLE", "", "limits.max_model_bytes");
    /* once m is unloaded its bytes are free again */
    ck_assert_int_eq(attnd_models_unload(ms, "m", &e), 0);
    ck_assert_int_eq(metric(ms, "attnd_model_weights_bytes"), 0);
    ck_assert_int_eq(load(ms, &n, 0), 1);
    attnd_models_free(ms);
}
END_TEST

/* A weights file that does not read: 400, the version serving keeps
 * serving, and the index says why; a model whose first load failed is
 * UNAVAILABLE. */
START_TEST(test_broken_weights) {
    attnd_models *ms = attnd_models_new(0);
    char p[128], bad[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    attnd_model_config broken = test_model_entry("m", &HP, garbage(bad));
    ck_assert_int_eq(load(ms, &m, 0), 1);
    load_refused(ms, &broken, AERR_BAD_REQUEST, bad);
    attnd_version *v = get(ms, "m");
    ck_assert_int_eq(v->info.version, 1);
    attnd_version_unref(v);
    index_says(ms, "m", "READY", "1", bad);
    ck_assert(has_line(ms, "attnd_model_loads_total{model=\"m\",result=\"failed\"} 1\n"));
    /* the next good load clears the reason */
    ck_assert_int_eq(load(ms, &m, 0), 2);
    index_says(ms, "m", "READY", "2", "");
    /* a missing file, and a model never loaded */
    attnd_model_config missing = test_model_entry("m", &HP, path_of("w2", p));
    load_refused(ms, &missing, AERR_BAD_REQUEST, "cannot open");
    attnd_model_config n = test_model_entry("n", &HP, bad);
    load_refused(ms, &n, AERR_BAD_REQUEST, bad);
    index_says(ms, "n", "UNAVAILABLE", "", bad);
    attnd_error e = {AOK, ""};
    ck_assert_ptr_null(attnd_models_get(ms, "n", &e));
    ck_assert_int_eq(attnd_kind_status(e.code), 404);
    ck_assert_msg(strstr(e.msg, "model 'n' is not loaded") && strstr(e.msg, bad), "%s", e.msg);
    /* the ready-only index lists m alone */
    json_t *o = index_entry(ms, "n", 1);
    ck_assert_ptr_null(o);
    o = index_entry(ms, "m", 1);
    ck_assert_ptr_nonnull(o);
    json_decref(o);
    attnd_models_free(ms);
}
END_TEST

/* ---- unload ---- */

START_TEST(test_unload) {
    attnd_models *ms = attnd_models_new(0);
    char p[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    attnd_error e = {AOK, ""};
    load(ms, &m, 0);
    attnd_version *a = get(ms, "m"); /* a request or a session still on it */
    atomic_store(&g_released, 0);
    count_release(a);
    ck_assert_int_eq(attnd_models_unload(ms, "m", &e), 0);
    ck_assert_ptr_null(attnd_models_get(ms, "m", &e));
    ck_assert_int_eq(e.code, AERR_NOT_FOUND);
    ck_assert_msg(strstr(e.msg, "model 'm' is not loaded (unloaded"), "%s", e.msg);
    ck_assert_int_eq(attnd_models_slot(ms, "m"), -1);
    ck_assert_ptr_null(attnd_models_sole(ms));
    index_says(ms, "m", "UNLOADING", "1", "unloaded");
    ck_assert_int_eq(released(), 0);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 1);
    ck_assert(has_line(ms, "attnd_model_unloads_total{model=\"m\",result=\"ok\"} 1\n"));
    ck_assert(!has_line(ms, "attnd_model_version{model=\"m\"}"));
    attnd_version_unref(a); /* the last holder: now it goes */
    ck_assert_int_eq(released(), 1);
    index_says(ms, "m", "UNAVAILABLE", "1", "unloaded");
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 0);
    ck_assert_int_eq(metric(ms, "attnd_model_weights_bytes"), 0);
    /* again: nothing to do; a name never loaded: 404 */
    ck_assert_int_eq(attnd_models_unload(ms, "m", &e), 0);
    ck_assert_int_eq(attnd_models_unload(ms, "never", &e), -1);
    ck_assert_int_eq(attnd_kind_status(e.code), 404);
    ck_assert_msg(strstr(e.msg, "unknown model 'never'"), "%s", e.msg);
    /* loaded again: the next version, in its old slot */
    ck_assert_int_eq(load(ms, &m, 0), 2);
    attnd_version *b = get(ms, "m");
    ck_assert_int_eq(b->slot, 0);
    attnd_version_unref(b);
    index_says(ms, "m", "READY", "2", "");
    attnd_models_free(ms);
}
END_TEST

/* A load that fails while an unloaded model's old version is still held
 * leaves it UNLOADING, with the load's sentence as its reason, until that
 * version goes. */
START_TEST(test_failed_load_while_unloading) {
    attnd_models *ms = attnd_models_new(0);
    char p[128], bad[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    attnd_model_config broken = test_model_entry("m", &HP, garbage(bad));
    attnd_error e = {AOK, ""};
    load(ms, &m, 0);
    attnd_version *a = get(ms, "m");
    ck_assert_int_eq(attnd_models_unload(ms, "m", &e), 0);
    load_refused(ms, &broken, AERR_BAD_REQUEST, bad);
    index_says(ms, "m", "UNLOADING", "1", bad);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 1);
    attnd_version_unref(a);
    index_says(ms, "m", "UNAVAILABLE", "1", bad);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 0);
    attnd_models_free(ms);
}
END_TEST

/* ---- lookups ---- */

START_TEST(test_find_by_fingerprint) {
    attnd_models *ms = attnd_models_new(0);
    char p1[128], p2[128];
    attnd_model_config w1 = test_model_entry("m", &HP, weights("w1", 1, p1));
    attnd_model_config w2 = test_model_entry("m", &HP, weights("w2", 2, p2));
    load(ms, &w1, 0);
    attnd_version *a = get(ms, "m");
    load(ms, &w2, 0);
    attnd_version *b = get(ms, "m");
    ck_assert_str_ne(a->fingerprint, b->fingerprint);
    ck_assert_str_eq(a->info.fingerprint, a->fingerprint);
    attnd_version *f = attnd_models_find(ms, "m", a->fingerprint); /* old, held by us */
    ck_assert_ptr_eq(f, a);
    ck_assert_int_eq(refs_of(a), 2);
    attnd_version_unref(f);
    f = attnd_models_find(ms, "m", b->fingerprint);
    ck_assert_ptr_eq(f, b);
    attnd_version_unref(f);
    ck_assert_ptr_null(attnd_models_find(ms, "m", "0000"));
    ck_assert_ptr_null(attnd_models_find(ms, "other", a->fingerprint));
    char fp[ATTND_FINGERPRINT_LEN + 1];
    snprintf(fp, sizeof fp, "%s", a->fingerprint);
    attnd_version_unref(a); /* gone: not found any more */
    ck_assert_ptr_null(attnd_models_find(ms, "m", fp));
    /* after an unload, a version still held is found */
    attnd_error e;
    ck_assert_int_eq(attnd_models_unload(ms, "m", &e), 0);
    f = attnd_models_find(ms, "m", b->fingerprint);
    ck_assert_ptr_eq(f, b);
    attnd_version_unref(f);
    attnd_version_unref(b);
    attnd_models_free(ms);
}
END_TEST

/* A version whose last reference just went is on its model's list until
 * the table's release takes it off, under the table's mutex: a look-up by
 * fingerprint in between (a session restored while the last request on
 * an old version ends) must not take it, for it is freed right after. */
static attnd_models *g_ms;
static attnd_version *g_found;

static void find_then_release(attnd_version *v, void *arg) {
    g_found = attnd_models_find(g_ms, v->name, v->fingerprint); /* v: refs 0, still listed */
    g_release(v, arg);
}

START_TEST(test_find_skips_a_version_let_go) {
    g_ms = attnd_models_new(0);
    char p1[128], p2[128];
    attnd_model_config w1 = test_model_entry("m", &HP, weights("w1", 1, p1));
    attnd_model_config w2 = test_model_entry("m", &HP, weights("w2", 2, p2));
    load(g_ms, &w1, 0);
    attnd_version *a = get(g_ms, "m");
    load(g_ms, &w2, 0); /* a: held by us alone */
    g_release = a->release;
    a->release = find_then_release;
    g_found = (attnd_version *)&g_found; /* not NULL: the hook must run */
    attnd_version_unref(a);
    ck_assert_msg(g_found == NULL, "a version let go was found (and is freed now)");
    attnd_models_free(g_ms);
}
END_TEST

START_TEST(test_sole) {
    attnd_models *ms = attnd_models_new(0);
    ck_assert_ptr_null(attnd_models_sole(ms));
    attnd_model_config m = test_model_entry("m", &HP, NULL);
    attnd_model_config n = test_model_entry("n", &HP, NULL);
    load(ms, &m, 0);
    attnd_version *s = attnd_models_sole(ms);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s->name, "m");
    ck_assert_int_eq(refs_of(s), 2); /* held for the caller */
    attnd_version_unref(s);
    load(ms, &n, 0);
    ck_assert_ptr_null(attnd_models_sole(ms)); /* two serve */
    attnd_error e;
    ck_assert_int_eq(attnd_models_unload(ms, "m", &e), 0);
    s = attnd_models_sole(ms);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s->name, "n");
    attnd_version_unref(s);
    attnd_version *both[2];
    ck_assert_int_eq(attnd_models_serving(ms, both, 2), 1);
    ck_assert_ptr_eq(both[0]->name, both[0]->info.name);
    attnd_version_unref(both[0]);
    attnd_models_free(ms);
}
END_TEST

/* ---- the loader thread ---- */

/* A load_async's result, and the thread it came on. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls, rc, version;
    attnd_error e;
    pthread_t on;
} done_box;

static void done_box_init(done_box *d) {
    memset(d, 0, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
}

static void on_done(void *arg, int rc, int version, const attnd_error *e) {
    done_box *d = arg;
    pthread_mutex_lock(&d->mu);
    d->calls++;
    d->rc = rc;
    d->version = version;
    d->e = *e;
    d->on = pthread_self();
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Waits for the box's calls-th call. */
static void wait_calls(done_box *d, int calls) {
    pthread_mutex_lock(&d->mu);
    while (d->calls < calls)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

START_TEST(test_loader_async_wait_stop) {
    attnd_models *ms = attnd_models_new(0);
    char p[128], bad[128];
    attnd_model_config m = test_model_entry("m", &HP, weights("w1", 1, p));
    attnd_model_config broken = test_model_entry("m", &HP, garbage(bad));
    attnd_error e = {AOK, ""};
    int version = 0;
    /* without the thread, load_wait loads here */
    ck_assert_int_eq(attnd_models_load_wait(ms, &m, 0, &version, &e), 0);
    ck_assert_int_eq(version, 1);
    ck_assert_int_eq(attnd_models_load_async(ms, &m, on_done, NULL, &e), -1);
    ck_assert_int_eq(e.code, AERR_UNAVAILABLE);
    ck_assert_int_eq(attnd_models_start(ms), 0);
    done_box d;
    done_box_init(&d);
    ck_assert_int_eq(attnd_models_load_async(ms, &m, on_done, &d, &e), 0);
    wait_calls(&d, 1);
    ck_assert_int_eq(d.rc, 0);
    ck_assert_int_eq(d.version, 2);
    ck_assert(!pthread_equal(d.on, pthread_self())); /* on the loader thread */
    ck_assert_int_eq(attnd_models_load_async(ms, &broken, on_done, &d, &e), 0);
    wait_calls(&d, 2);
    ck_assert_int_eq(d.rc, -1);
    ck_assert_int_eq(d.e.code, AERR_BAD_REQUEST);
    ck_assert_msg(strstr(d.e.msg, bad) != NULL, "%s", d.e.msg);
    ck_assert_int_eq(attnd_models_load_wait(ms, &m, 0, &version, &e), 0);
    ck_assert_int_eq(version, 3);
    ck_assert_int_eq(attnd_models_load_wait(ms, &m, LOAD_IF_CHANGED, &version, &e), 0);
    ck_assert_int_eq(version, 3);
    ck_assert_int_eq(attnd_models_load_wait(ms, &broken, 0, &version, &e), -1);
    ck_assert_int_eq(e.code, AERR_BAD_REQUEST);
    /* queued loads run before the thread ends */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(attnd_models_load_async(ms, &m, on_done, &d, &e), 0);
    attnd_models_stop(ms);
    ck_assert_int_eq(d.calls, 5);
    ck_assert_int_eq(d.version, 6);
    /* stopped: async refused (done never called), wait loads here */
    ck_assert_int_eq(attnd_models_load_async(ms, &m, on_done, &d, &e), -1);
    ck_assert_int_eq(e.code, AERR_UNAVAILABLE);
    ck_assert_int_eq(attnd_models_load_wait(ms, &m, 0, &version, &e), 0);
    ck_assert_int_eq(version, 7);
    ck_assert_int_eq(d.calls, 5);
    attnd_models_stop(ms); /* again: nothing */
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 1);
    attnd_models_free(ms);
    pthread_mutex_destroy(&d.mu);
    pthread_cond_destroy(&d.cv);
}
END_TEST

/* ---- threads ---- */

typedef struct {
    attnd_models *ms;
    const char *fp[2]; /* the fingerprints of w1 and w2 */
    atomic_int *stop;
    atomic_long gets; /* read by the main thread while it runs */
    long finds, bad;
} reader;

/* Gets "m" and finds its versions by fingerprint until stopped: every get
 * finds one, versions never go back, weights are readable, a find gives
 * a version with the fingerprint asked for. Failures counted, not
 * asserted (Check asserts from the main thread). */
static void *read_loop(void *arg) {
    reader *r = arg;
    int last = 0;
    volatile float sink = 0;
    for (long k = 0; !atomic_load(r->stop); k++) {
        attnd_error e;
        attnd_version *v = attnd_models_get(r->ms, "m", &e);
        if (!v) {
            r->bad++;
            continue;
        }
        atomic_fetch_add(&r->gets, 1);
        if (v->info.version < last) r->bad++;
        last = v->info.version;
        sink += v->model.mem[v->model.n_floats - 1];
        attnd_version *f = attnd_models_find(r->ms, "m", r->fp[k % 2]);
        if (f) {
            r->finds++;
            if (strcmp(f->fingerprint, r->fp[k % 2]) != 0) r->bad++;
            sink += f->model.mem[0];
        }
        attnd_version_unref(f);
        attnd_version_unref(v);
        if (k % 64 == 0) { /* the index and the metrics read the table too */
            size_t len;
            free(attnd_models_index(r->ms, 0, &len));
        }
    }
    (void)sink;
    return NULL;
}

/* Readers get and find versions while the main thread reloads 50 times,
 * alternating two weights files, on the loader thread and on its own: no
 * reader ever misses the model, every version is freed once its last
 * holder lets go, and ThreadSanitizer (make tsan) sees no race. */
START_TEST(test_reload_while_reading) {
    enum { READERS = 3, RELOADS = 50 };
    attnd_models *ms = attnd_models_new(0);
    char p1[128], p2[128], fp[2][ATTND_FINGERPRINT_LEN + 1];
    attnd_model_config w[2] = {test_model_entry("m", &HP, weights("w1", 1, p1)),
                               test_model_entry("m", &HP, weights("w2", 2, p2))};
    for (int i = 0; i < 2; i++) {
        load(ms, &w[i], 0);
        attnd_version *v = get(ms, "m");
        snprintf(fp[i], sizeof fp[i], "%s", v->fingerprint);
        attnd_version_unref(v);
    }
    ck_assert_int_eq(attnd_models_start(ms), 0); /* frees run on the loader thread */
    atomic_int stop = 0;
    reader r[READERS];
    pthread_t t[READERS];
    for (int i = 0; i < READERS; i++) {
        r[i] = (reader){ms, {fp[0], fp[1]}, &stop, 0, 0, 0};
        ck_assert_int_eq(pthread_create(&t[i], NULL, read_loop, &r[i]), 0);
    }
    for (int i = 0; i < READERS; i++) /* every reader under way before the first reload */
        while (atomic_load(&r[i].gets) == 0)
            usleep(100);
    for (int i = 0; i < RELOADS; i++) {
        attnd_error e = {AOK, ""};
        int version = 0;
        if (i % 2)
            ck_assert_int_eq(attnd_models_load_wait(ms, &w[i % 2], 0, &version, &e), 0);
        else
            version = load(ms, &w[i % 2], 0);
        ck_assert_int_eq(version, 3 + i);
        attnd_sbuf b;
        attnd_sb_init(&b);
        attnd_models_metrics(ms, &b);
        attnd_sb_free(&b);
    }
    atomic_store(&stop, 1);
    long gets = 0, finds = 0;
    for (int i = 0; i < READERS; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(r[i].bad, 0);
        gets += atomic_load(&r[i].gets);
        finds += r[i].finds;
    }
    printf("reload while reading: %d reloads, %ld gets, %ld finds\n", RELOADS, gets, finds);
    ck_assert_int_gt(gets, 0);
    attnd_models_stop(ms);
    attnd_version *v = get(ms, "m");
    ck_assert_int_eq(v->info.version, 2 + RELOADS);
    ck_assert_int_eq(metric(ms, "attnd_model_versions_held"), 1); /* every old one freed */
    ck_assert_int_eq(metric(ms, "attnd_model_weights_bytes"), (long long)v->info.bytes);
    attnd_version_unref(v);
    attnd_models_free(ms);
}
END_TEST

typedef struct {
    attnd_models *ms;
    atomic_int *stop;
    atomic_long refused; /* read by the main thread while it runs */
    long bad;
} asker;

/* Asks for "n", whose loads fail, until stopped: a 404 every time. */
static void *ask_loop(void *arg) {
    asker *a = arg;
    while (!atomic_load(a->stop)) {
        attnd_error e = {AOK, ""};
        attnd_version *v = attnd_models_get(a->ms, "n", &e);
        if (v || e.code != AERR_NOT_FOUND || !strstr(e.msg, "'n'")) a->bad++;
        attnd_version_unref(v);
        atomic_fetch_add(&a->refused, 1);
    }
    return NULL;
}

/* Requests for a model whose loads keep failing, while they fail: each
 * is refused with the reason of a load (read while another load writes
 * it: ThreadSanitizer, under make tsan, sees any race). */
START_TEST(test_refused_while_loads_fail) {
    attnd_models *ms = attnd_models_new(0);
    char bad[128];
    attnd_model_config n = test_model_entry("n", &HP, garbage(bad));
    load_refused(ms, &n, AERR_BAD_REQUEST, bad);
    atomic_int stop = 0;
    asker a = {ms, &stop, 0, 0};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, ask_loop, &a), 0);
    /* 30 failed loads at least, and as many as it takes to refuse 100 requests meanwhile */
    for (int i = 0; i < 30 || atomic_load(&a.refused) < 100; i++)
        load_refused(ms, &n, AERR_BAD_REQUEST, bad);
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.bad, 0);
    ck_assert_int_ge(atomic_load(&a.refused), 100);
    index_says(ms, "n", "UNAVAILABLE", "", bad);
    attnd_models_free(ms);
}
END_TEST

int main(void) {
    attnd_log_setup("text", "warn", 0); /* every load says so at info */
    Suite *s = suite_create("server_models");
    TCase *tv = tcase_create("table");
    tcase_add_checked_fixture(tv, dir_new, dir_free);
    tcase_add_test(tv, test_versions_count_up);
    tcase_add_test(tv, test_get_holds_a_reference);
    tcase_add_test(tv, test_load_if_changed);
    tcase_add_test(tv, test_max_bytes_refused);
    tcase_add_test(tv, test_broken_weights);
    tcase_add_test(tv, test_unload);
    tcase_add_test(tv, test_failed_load_while_unloading);
    tcase_add_test(tv, test_find_by_fingerprint);
    tcase_add_test(tv, test_find_skips_a_version_let_go);
    tcase_add_test(tv, test_sole);
    tcase_add_test(tv, test_loader_async_wait_stop);
    suite_add_tcase(s, tv);
    TCase *tt = tcase_create("threads");
    tcase_set_timeout(tt, 120); /* ThreadSanitizer slows it down */
    tcase_add_checked_fixture(tt, dir_new, dir_free);
    tcase_add_test(tt, test_reload_while_reading);
    tcase_add_test(tt, test_refused_while_loads_fail);
    suite_add_tcase(s, tt);
    return check_run(s);
}
