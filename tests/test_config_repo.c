/* test_config_repo.c - what the model registry reads from config/ (SPEC
 * section 12): paths kept in the model folder, one model entry given as
 * JSON text, a model entry's copy, comparison and freeing, and the
 * start-up road run again (config/confine.c, read.c, keys.c, env.c).
 *
 *   confine   relative and absolute paths inside the folder; "..", absolute
 *             paths elsewhere and symbolic links out refused, each message
 *             naming the path and the folder; missing files refused.
 *   entry     an entry lands as the config file's would; "name" from the
 *             path, or equal to it; every refusal named under
 *             "parameters.config" without "models[i]"; a failed entry holds
 *             nothing.
 *   copy      a copy is equal and owns its strings; each field changed makes
 *             the entries differ.
 *   reread    the file, variables and flags read again, weights files not
 *             opened; a broken file refused; no file gives the default model;
 *             the server keys that changed, and only those.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../config/config.h"
#include "check_run.h"

static char g_dir[256];    /* a fresh folder per test */
static char g_models[300]; /* g_dir/models: the model folder */
static char g_real[512];   /* realpath(g_models) */
static char g_cfg[300];    /* g_dir/models/c.json */

/* Files and links the fixture makes, relative to g_dir, removed in reverse. */
static const char *const made[] = {
    "outside.safetensors",      /* a weights file outside the model folder */
    "models",                   /* the model folder */
    "models/w.safetensors",     /* a weights file in it */
    "models/sub",               /* a folder in it */
    "models/sub/x.safetensors", /* a weights file deeper */
    "models/link_in",           /* -> w.safetensors: a link that stays */
    "models/link_out",          /* -> ../outside.safetensors: a link out */
    "models/dir_out",           /* -> g_dir: a folder link out */
    "models_link",              /* -> models: the folder through a link */
};

static const char *const env_vars[] = {"ATTND_CONFIG", "ATTND_PORT", "ATTND_WORKERS",
                                       "ATTND_MODEL_DIR", "ATTND_CORS_ORIGINS"};

static void path_of(const char *rel, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", g_dir, rel);
}

static void touch(const char *rel) {
    char p[600];
    path_of(rel, p, sizeof p);
    FILE *f = fopen(p, "w");
    ck_assert(f && fputs("{}", f) >= 0 && fclose(f) == 0);
}

static void link_to(const char *target, const char *rel) {
    char p[600];
    path_of(rel, p, sizeof p);
    ck_assert(symlink(target, p) == 0);
}

static void setup(void) {
    char p[600];
    for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++)
        unsetenv(env_vars[i]);
    snprintf(g_dir, sizeof g_dir, "/tmp/attnd-repo-XXXXXX");
    ck_assert(mkdtemp(g_dir) != NULL);
    touch("outside.safetensors");
    path_of("models", g_models, sizeof g_models);
    ck_assert(mkdir(g_models, 0700) == 0);
    touch("models/w.safetensors");
    path_of("models/sub", p, sizeof p);
    ck_assert(mkdir(p, 0700) == 0);
    touch("models/sub/x.safetensors");
    link_to("w.safetensors", "models/link_in");
    link_to("../outside.safetensors", "models/link_out");
    link_to(g_dir, "models/dir_out");
    link_to("models", "models_link");
    char *r = realpath(g_models, NULL);
    ck_assert(r != NULL);
    snprintf(g_real, sizeof g_real, "%s", r);
    free(r);
    path_of("models/c.json", g_cfg, sizeof g_cfg);
}

static void teardown(void) {
    char p[600];
    unlink(g_cfg);
    for (int i = (int)(sizeof made / sizeof made[0]) - 1; i >= 0; i--) {
        path_of(made[i], p, sizeof p);
        if (unlink(p) != 0) rmdir(p);
    }
    rmdir(g_dir);
}

static void write_cfg(const char *text) {
    FILE *f = fopen(g_cfg, "w");
    ck_assert(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* ------------------------------------------------------------ confine */

/* path confined to dir must resolve to g_real/want. */
static void expect_inside(const char *dir, const char *path, const char *want) {
    char err[512], full[700];
    char *res = (char *)1;
    int rc = attnd_path_confine(dir, path, &res, err, sizeof err);
    ck_assert_msg(rc == 0, "'%s' refused: %s", path, err);
    snprintf(full, sizeof full, "%s/%s", g_real, want);
    ck_assert_str_eq(res, full);
    free(res);
}

/* path confined to dir is refused; the message names the path, the
 * folder as given, server.model_dir and why. */
static void expect_refused_rc(const char *dir, const char *path, const char *why, int want) {
    char err[512];
    char *res = (char *)1;
    int rc = attnd_path_confine(dir, path, &res, err, sizeof err);
    ck_assert_msg(rc == want, "'%s': %d, not %d", path, rc, want);
    ck_assert(res == NULL);
    char quoted[600];
    snprintf(quoted, sizeof quoted, "'%s'", path);
    ck_assert_msg(strstr(err, quoted) && strstr(err, dir) && strstr(err, "(server.model_dir)") &&
                      strstr(err, why),
                  "'%s': message \"%s\" lacks \"%s\"", path, err, why);
}

/* A path that leaves the folder: -1. */
static void expect_outside(const char *dir, const char *path, const char *why) {
    expect_refused_rc(dir, path, why, -1);
}

/* A path inside that names no file to open: -2 (a load that fails). */
static void expect_missing(const char *dir, const char *path, const char *why) {
    expect_refused_rc(dir, path, why, -2);
}

START_TEST(confine_inside) {
    char abs[600];
    expect_inside(g_models, "w.safetensors", "w.safetensors");
    expect_inside(g_models, "./w.safetensors", "w.safetensors");
    expect_inside(g_models, "sub//x.safetensors", "sub/x.safetensors");
    expect_inside(g_models, "link_in", "w.safetensors"); /* a link that stays inside */
    path_of("models/sub/x.safetensors", abs, sizeof abs);
    expect_inside(g_models, abs, "sub/x.safetensors"); /* absolute, inside */
    /* the folder named through a link: paths compare resolved */
    char via[600];
    path_of("models_link", via, sizeof via);
    expect_inside(via, "w.safetensors", "w.safetensors");
    expect_inside(via, abs, "sub/x.safetensors");
    path_of("models_link/w.safetensors", abs, sizeof abs);
    expect_inside(g_models, abs, "w.safetensors");
}
END_TEST

START_TEST(confine_refused) {
    char abs[600];
    expect_outside(g_models, "../outside.safetensors", "leaves the model folder");
    expect_outside(g_models, "../outside.safetensors", "'..' is not allowed");
    /* ".." is refused outright, even where it would come back inside */
    expect_outside(g_models, "sub/../w.safetensors", "'..' is not allowed");
    expect_outside(g_models, "..", "'..' is not allowed");
    expect_outside(g_models, "sub/..", "'..' is not allowed");
    path_of("outside.safetensors", abs, sizeof abs);
    expect_outside(g_models, abs, "is outside the model folder");
    expect_outside(g_models, "/etc/passwd", "is outside the model folder");
    path_of("models/../outside.safetensors", abs, sizeof abs);
    expect_outside(g_models, abs, "'..' is not allowed");
    expect_outside(g_models, "link_out", "leaves the model folder");
    expect_outside(g_models, "link_out", "through a symbolic link");
    expect_outside(g_models, "dir_out/outside.safetensors", "through a symbolic link");
    expect_missing(g_models, "nope.safetensors", "No such file");
    expect_missing(g_models, "nope.safetensors", "cannot open");
    expect_missing(g_models, "...", "cannot open");                  /* a name, not ".." */
    expect_missing(g_models, "..data/w.safetensors", "cannot open"); /* Kubernetes' volumes */
    expect_outside(g_models, ".", "names the model folder");
    expect_missing(g_models, "sub/x.safetensors/", "cannot open"); /* not a folder */
    expect_outside("/nonexistent/models", "w.safetensors", "cannot be opened");
    char err[512];
    char *res = NULL;
    ck_assert(attnd_path_confine(NULL, "w.safetensors", &res, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "no model folder") && strstr(err, "server.model_dir"), "%s", err);
    ck_assert(attnd_path_confine(g_models, "", &res, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "empty path"), "%s", err);
    ck_assert(res == NULL);
}
END_TEST

/* ------------------------------------------------------------ entry */

/* Parses text for the route's name; expects a refusal whose message starts
 * "parameters.config: ", holds why, never a "models[" index, and mc empty. */
static void expect_entry_refused_as(const char *text, const char *name, const char *why, int want) {
    char err[512];
    attnd_model_config mc, zero;
    memset(&mc, 0, sizeof mc);
    memset(&zero, 0, sizeof zero);
    int rc = attnd_model_entry_parse(text, strlen(text), name, g_models, &mc, err, sizeof err);
    ck_assert_msg(rc == want, "%s: %d, not %d", text, rc, want);
    ck_assert_msg(strncmp(err, "parameters.config: ", 19) == 0, "%s", err);
    ck_assert_msg(strstr(err, why), "message \"%s\" lacks \"%s\"", err, why);
    ck_assert_msg(!strstr(err, "models["), "%s", err);
    ck_assert_msg(memcmp(&mc, &zero, sizeof mc) == 0, "a refused entry holds something");
}

/* A refused entry: -1, it asks for nothing that could load. */
static void expect_entry_refused(const char *text, const char *name, const char *why) {
    expect_entry_refused_as(text, name, why, -1);
}

static void entry_ok(const char *text, const char *name, attnd_model_config *mc) {
    char err[512];
    memset(mc, 0, sizeof *mc);
    int rc = attnd_model_entry_parse(text, strlen(text), name, g_models, mc, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: %s", text, err);
}

START_TEST(entry_lands) {
    attnd_model_config mc;
    char want[600];
    entry_ok("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"w.safetensors\"}", "enc", &mc);
    ck_assert_str_eq(mc.name, "enc"); /* from the path */
    snprintf(want, sizeof want, "%s/w.safetensors", g_real);
    ck_assert_str_eq(mc.weights, want); /* from the model folder, absolute */
    ck_assert_int_eq(mc.hp.embed_dim, 4);
    ck_assert_int_eq(mc.hp.kdim, 4); /* settled as for the file's entries */
    ck_assert_int_eq(mc.hp.bias, 1);
    ck_assert_str_eq(mc.prefix, "");
    ck_assert_str_eq(mc.layout, "torch");
    ck_assert_int_eq(mc.hp.precision, ATTN_FP32);
    attnd_model_config_free(&mc);
    ck_assert(mc.weights == NULL && mc.name[0] == '\0');

    entry_ok("{\"name\":\"dec\",\"embed_dim\":64,\"num_heads\":8,\"num_kv_heads\":2,"
             "\"layout\":\"llama\",\"precision\":\"bf16\",\"max_positions\":128,"
             "\"rope\":{\"theta\":500000},\"tensors\":{\"q_weight\":\"wq\"},"
             "\"weights\":\"sub/x.safetensors\"}",
             "dec", &mc);
    ck_assert_str_eq(mc.name, "dec");
    ck_assert_int_eq(mc.hp.num_kv_heads, 2);
    ck_assert_int_eq(mc.hp.causal, 1); /* llama's default */
    ck_assert_int_eq(mc.hp.rope.dim, 8);
    ck_assert_int_eq(mc.hp.precision, ATTN_BF16);
    ck_assert_str_eq(mc.tensors[ROLE_Q_WEIGHT], "wq");
    ck_assert_int_eq(mc.max_positions, 128);
    snprintf(want, sizeof want, "%s/sub/x.safetensors", g_real);
    ck_assert_str_eq(mc.weights, want);
    attnd_model_config_free(&mc);
}
END_TEST

START_TEST(entry_refused) {
    expect_entry_refused("{\"name\":\"x\",\"embed_dim\":4,\"num_heads\":2,"
                         "\"weights\":\"w.safetensors\"}",
                         "enc", "name: 'x' does not match the name in the path 'enc'");
    expect_entry_refused("{\"embed_dim\":\"4\",\"num_heads\":2,\"weights\":\"w.safetensors\"}",
                         "enc", "parameters.config: embed_dim: must be an integer");
    expect_entry_refused("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"w.safetensors\","
                         "\"dropout\":0.1}",
                         "enc", "parameters.config: dropout: unknown key");
    expect_entry_refused("{\"embed_dim\":4,\"num_heads\":2}", "enc",
                         "parameters.config: weights: missing");
    expect_entry_refused("{\"embed_dim\":6,\"num_heads\":4,\"weights\":\"w.safetensors\"}", "enc",
                         "parameters.config: num_heads: 4 does not divide embed_dim 6");
    expect_entry_refused("{\"embed_dim\":64,\"num_heads\":8,\"layout\":\"llama\","
                         "\"rope\":{\"dim\":10},\"weights\":\"w.safetensors\"}",
                         "enc", "parameters.config: rope.dim: 10 is wider than a head");
    expect_entry_refused("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"w.safetensors\","
                         "\"tensors\":{\"query\":\"q\"}}",
                         "enc", "parameters.config: tensors.query: unknown role");
    expect_entry_refused("{\"embed_dim\":4,\"num_heads\":2,"
                         "\"weights\":\"../outside.safetensors\"}",
                         "enc",
                         "parameters.config: weights: '../outside.safetensors' leaves the "
                         "model folder");
    expect_entry_refused("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"link_out\"}", "enc",
                         "through a symbolic link");
    expect_entry_refused("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"/etc/passwd\"}", "enc",
                         "weights: '/etc/passwd' is outside the model folder");
    /* a sound entry whose file inside is missing: -2, a load that fails */
    expect_entry_refused_as("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"nope.safetensors\"}",
                            "enc", "weights: cannot open 'nope.safetensors'", -2);
    expect_entry_refused_as("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"sub\"}", "enc",
                            "weights: weights \"", -2);
    expect_entry_refused_as("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"sub\"}", "enc",
                            "is not a regular file", -2);
    expect_entry_refused("{\"embed_dim\":4,", "enc", "parameters.config: not valid JSON");
    expect_entry_refused("", "enc", "not valid JSON");
    expect_entry_refused("[]", "enc",
                         "must be a JSON object (one entry of \"models\"), not an "
                         "array");
    expect_entry_refused("{\"embed_dim\":4,\"embed_dim\":4,\"num_heads\":2,"
                         "\"weights\":\"w.safetensors\"}",
                         "enc", "duplicate");
    /* the route's name when the entry has none: checked as a name */
    expect_entry_refused("{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"w.safetensors\"}", "a b",
                         "name: \"a b\" may hold only letters");
    expect_entry_refused("{\"name\":5,\"embed_dim\":4,\"num_heads\":2,"
                         "\"weights\":\"w.safetensors\"}",
                         "enc", "name: must be a string");
    /* no model folder: every weights path is refused */
    char err[512];
    attnd_model_config mc;
    memset(&mc, 0, sizeof mc);
    const char *text = "{\"embed_dim\":4,\"num_heads\":2,\"weights\":\"w.safetensors\"}";
    ck_assert(attnd_model_entry_parse(text, strlen(text), "enc", NULL, &mc, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "no model folder"), "%s", err);
    ck_assert(mc.weights == NULL);
}
END_TEST

/* ------------------------------------------------------------ copy */

static const char *const FULL_ENTRY =
    "{\"embed_dim\":64,\"num_heads\":8,\"num_kv_heads\":2,\"head_dim\":8,\"scale\":0.25,"
    "\"layout\":\"llama\",\"precision\":\"bf16\",\"max_positions\":128,\"prefix\":\"l.0.\","
    "\"rope\":{\"theta\":500000,\"scaling\":{\"type\":\"linear\",\"factor\":2}},"
    "\"tensors\":{\"q_weight\":\"wq\",\"out_bias\":\"bo\"},\"weights\":\"w.safetensors\"}";

START_TEST(copy_and_equal) {
    attnd_model_config a, b;
    entry_ok(FULL_ENTRY, "dec", &a);
    ck_assert(attnd_model_config_copy(&b, &a) == 0);
    ck_assert(attnd_model_config_equal(&a, &b));
    ck_assert(attnd_model_config_equal(&b, &a));
    /* b owns its strings */
    ck_assert(b.weights != a.weights && b.prefix != a.prefix && b.layout != a.layout &&
              b.precision != a.precision && b.tensors[ROLE_Q_WEIGHT] != a.tensors[ROLE_Q_WEIGHT]);
    ck_assert(b.tensors[ROLE_K_WEIGHT] == NULL);
    attnd_model_config_free(&a);
    ck_assert_str_eq(b.weights + strlen(b.weights) - 13, "w.safetensors");
    ck_assert_str_eq(b.tensors[ROLE_OUT_BIAS], "bo");
    attnd_model_config_free(&b);

    /* zeroed entries, and one without strings (the embedded default's kind) */
    memset(&a, 0, sizeof a);
    ck_assert(attnd_model_config_copy(&b, &a) == 0);
    ck_assert(attnd_model_config_equal(&a, &b));
    attnd_model_config_free(&b);
    attnd_model_config_free(&b); /* a freed entry frees again safely */
}
END_TEST

/* Each field changed on its own makes two entries differ. */
START_TEST(equal_sees_every_field) {
    attnd_model_config a, b;
    entry_ok(FULL_ENTRY, "dec", &a);
    for (int change = 0; change < 17; change++) {
        ck_assert(attnd_model_config_copy(&b, &a) == 0);
        char *s = NULL;
        // clang-format off
        switch (change) {
        case 0: snprintf(b.name, sizeof b.name, "dec2"); break;
        case 1: b.hp.embed_dim++; break;
        case 2: b.hp.num_heads = 4; break;
        case 3: b.hp.num_kv_heads = 1; break;
        case 4: b.hp.head_dim = 16; break;
        case 5: b.hp.scale = 0.5; break;
        case 6: b.hp.causal = 0; break;
        case 7: b.hp.bias = 1; break;
        case 8: b.hp.rope.theta = 10000; break;
        case 9: b.hp.rope.factor = 3; break;
        case 10: b.max_positions = 0; break;
        case 11: s = b.weights; b.weights = strdup("/elsewhere.safetensors"); break;
        case 12: s = b.prefix; b.prefix = strdup(""); break;
        case 13: s = b.layout; b.layout = strdup("hf_proj"); break;
        case 14: s = b.precision; b.precision = strdup("fp32"); break;
        case 15: s = b.tensors[ROLE_OUT_BIAS]; b.tensors[ROLE_OUT_BIAS] = NULL; break;
        case 16: b.tensors[ROLE_V_BIAS] = strdup("bv"); break;
        }
        // clang-format on
        free(s);
        ck_assert_msg(!attnd_model_config_equal(&a, &b), "change %d unseen", change);
        ck_assert_msg(!attnd_model_config_equal(&b, &a), "change %d unseen", change);
        attnd_model_config_free(&b);
    }
    /* a hand-made entry (no precision word) differs by its settled precision */
    memset(&b, 0, sizeof b);
    attnd_model_config c = b;
    c.hp.precision = ATTN_BF16;
    ck_assert(!attnd_model_config_equal(&b, &c));
    attnd_model_config_free(&a);
}
END_TEST

/* ------------------------------------------------------------ reread */

#define MODEL(name, e)                                                                             \
    "{\"name\":\"" name "\",\"embed_dim\":" #e ",\"num_heads\":2,\"weights\":\"w.safetensors\"}"

START_TEST(reread_runs_the_road_again) {
    char err[512];
    attnd_config run, fresh;
    int help = 0;
    write_cfg("{\"server\":{\"port\":1000,\"host\":\"10.0.0.1\"},\"models\":[" MODEL("a", 4) "]}");
    char *argv[] = {"attnd", "--config", g_cfg, "--host", "::1", NULL};
    ck_assert_msg(attnd_config_from_args(&run, 5, argv, &help, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(run.n_models, 1);

    write_cfg("{\"server\":{\"port\":1001,\"host\":\"10.0.0.2\"},\"workers\":{\"threads\":3},"
              "\"models\":[" MODEL("a", 8) "," MODEL("b", 4) "]}");
    setenv("ATTND_WORKERS", "5", 1); /* variables are read again too */
    memset(&fresh, 0, sizeof fresh);
    ck_assert_msg(attnd_config_reread(&run, &fresh, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(fresh.port, 1001);        /* the file as it is now */
    ck_assert_str_eq(fresh.host, "::1");       /* the flag still wins */
    ck_assert_int_eq(fresh.worker_threads, 5); /* the variable over the file */
    ck_assert_int_eq(fresh.n_models, 2);
    ck_assert_int_eq(fresh.models[0].hp.embed_dim, 8);
    ck_assert_str_eq(fresh.models[1].name, "b");
    ck_assert_str_eq(fresh.model_dir, run.model_dir);
    ck_assert_str_eq(fresh.config_path, g_cfg);
    ck_assert(fresh.argv == argv && fresh.argc == 5); /* so that it can be reread again */
    ck_assert(!attnd_model_config_equal(&run.models[0], &fresh.models[0]));
    attnd_config_free(&fresh);

    /* a missing weights file is the model's business: the config is sound */
    write_cfg("{\"models\":[{\"name\":\"a\",\"embed_dim\":4,\"num_heads\":2,"
              "\"weights\":\"gone.safetensors\"}]}");
    ck_assert_msg(attnd_config_reread(&run, &fresh, err, sizeof err) == 0, "%s", err);
    ck_assert(strstr(fresh.models[0].weights, "/models/gone.safetensors"));
    attnd_config_free(&fresh);

    /* a broken file is refused as at start, and fresh holds nothing */
    write_cfg("{\"models\":[" MODEL("a", 4) "," MODEL("b", 3) "]}");
    ck_assert(attnd_config_reread(&run, &fresh, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, g_cfg) && strstr(err, "models[1].num_heads") &&
                      strstr(err, "does not divide"),
                  "%s", err);
    ck_assert(fresh.host == NULL && fresh.n_models == 0 && fresh.models == NULL);
    unlink(g_cfg);
    ck_assert(attnd_config_reread(&run, &fresh, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, g_cfg) && strstr(err, "cannot open config file"), "%s", err);
    attnd_config_free(&run);
}
END_TEST

START_TEST(reread_without_a_file) {
    char err[512];
    attnd_config run, fresh;
    int help = 0;
    char *argv[] = {"attnd", "--port", "7", NULL};
    ck_assert_msg(attnd_config_from_args(&run, 3, argv, &help, err, sizeof err) == 0, "%s", err);
    setenv("ATTND_PORT", "9", 1); /* a flag still wins over it */
    memset(&fresh, 0, sizeof fresh);
    ck_assert_msg(attnd_config_reread(&run, &fresh, err, sizeof err) == 0, "%s", err);
    ck_assert(fresh.config_path == NULL);
    ck_assert_int_eq(fresh.port, 7);
    ck_assert_int_eq(fresh.n_models, 1);
    ck_assert_str_eq(fresh.models[0].name, "default");
    ck_assert(fresh.models[0].weights == NULL);
    ck_assert(attnd_model_config_equal(&run.models[0], &fresh.models[0]));
    ck_assert_str_eq(fresh.model_dir, run.model_dir);
    attnd_config_free(&fresh);
    attnd_config_free(&run);
}
END_TEST

/* What attnd_config_changed_keys reported, as "section.key " each. */
typedef struct {
    char list[1024];
    int n;
} changed;

static void note(const char *section, const char *key, void *arg) {
    changed *c = arg;
    size_t len = strlen(c->list);
    snprintf(c->list + len, sizeof c->list - len, "%s.%s ", section, key);
    c->n++;
}

static changed changes(const attnd_config *a, const attnd_config *b) {
    changed c = {.n = 0};
    c.list[0] = '\0';
    attnd_config_changed_keys(a, b, note, &c);
    return c;
}

START_TEST(changed_keys) {
    char err[512];
    attnd_config a, b;
    int help = 0;
    write_cfg("{\"server\":{\"cors_origins\":[\"http://a\",\"http://b\"]},"
              "\"models\":[" MODEL("a", 4) "]}");
    char *argv[] = {"attnd", "--config", g_cfg, NULL};
    ck_assert_msg(attnd_config_from_args(&a, 3, argv, &help, err, sizeof err) == 0, "%s", err);
    memset(&b, 0, sizeof b);
    ck_assert_msg(attnd_config_reread(&a, &b, err, sizeof err) == 0, "%s", err);
    changed c = changes(&a, &b);
    ck_assert_msg(c.n == 0, "unchanged config reports: %s", c.list);
    attnd_config_free(&b);

    /* models change freely: they are not the server table's */
    write_cfg("{\"server\":{\"port\":81,\"cors_origins\":[\"http://a\",\"http://c\"],"
              "\"model_control\":\"explicit\"},"
              "\"limits\":{\"max_model_bytes\":100},\"tracing\":{\"otlp_endpoint\":"
              "\"http://x:4318/v1/traces\"},\"models\":[" MODEL("a", 8) "," MODEL("b", 4) "]}");
    ck_assert_msg(attnd_config_reread(&a, &b, err, sizeof err) == 0, "%s", err);
    c = changes(&a, &b);
    ck_assert_str_eq(c.list, "server.port server.cors_origins server.model_control "
                             "limits.max_model_bytes tracing.otlp_endpoint ");
    c = changes(&b, &a); /* both ways */
    ck_assert_int_eq(c.n, 5);
    attnd_config_free(&b);

    /* a list of another length */
    write_cfg("{\"server\":{\"cors_origins\":[\"http://a\"]},\"models\":[" MODEL("a", 4) "]}");
    ck_assert_msg(attnd_config_reread(&a, &b, err, sizeof err) == 0, "%s", err);
    c = changes(&a, &b);
    ck_assert_str_eq(c.list, "server.cors_origins ");
    attnd_config_free(&b);
    attnd_config_free(&a);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("config_repo");
    TCase *t = tcase_create("config_repo");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, confine_inside);
    tcase_add_test(t, confine_refused);
    tcase_add_test(t, entry_lands);
    tcase_add_test(t, entry_refused);
    tcase_add_test(t, copy_and_equal);
    tcase_add_test(t, equal_sees_every_field);
    tcase_add_test(t, reread_runs_the_road_again);
    tcase_add_test(t, reread_without_a_file);
    tcase_add_test(t, changed_keys);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return check_run(suite());
}
