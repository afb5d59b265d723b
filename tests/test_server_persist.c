/* test_server_persist.c - a session's state out of the table and back in
 * (server/session/persist.c), on real model tables: a session exported
 * and restored where the same model is served holds the same rows (its
 * state file, exported again, is the same bytes); a file of a model served
 * here with other weights is refused with the 409 of its fingerprint, and
 * one of a model not served with the 409 that names the models that are.
 * make valgrind runs these restores under memcheck, which sees what the
 * sanitizers do not: a read of bytes nothing set (issue 34, state_model
 * scanning its look-up's error before knowing the look-up had failed).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/base/buffer.h"
#include "../server/session/persist.h"
#include "check_run.h"
#include "test_models.h"

#define TOKENS 3

/* "small" as served here, the same name with other weights (no biases:
 * another fingerprint, the same cache shape), and another model alone. */
static const attn_hparams SMALL = {.embed_dim = 4, .num_heads = 2, .kdim = 4, .vdim = 4, .bias = 1};
static const attn_hparams UNBIASED = {
    .embed_dim = 4, .num_heads = 2, .kdim = 4, .vdim = 4, .bias = 0};

static attnd_models *table_of(const char *name, const attn_hparams *hp) {
    char err[512];
    attnd_models *ms = attnd_models_new(0);
    ck_assert(ms != NULL);
    attnd_model_config mc = test_model_entry(name, hp, NULL);
    attnd_version *v = test_models_add(ms, &mc, err, sizeof err);
    ck_assert_msg(v != NULL, "%s", err);
    attnd_version_unref(v); /* the table holds it */
    return ms;
}

static attnd_sessions *sessions_new(void) {
    attnd_session_limits lim = {8, 1 << 20, 1 << 20, 60};
    attnd_sessions *t = attnd_sessions_new(&lim);
    ck_assert(t != NULL);
    attnd_sessions_hooks(t, test_version_hold, test_version_drop); /* as the daemon's */
    return t;
}

/* A session of TOKENS rows (token t's floats t, t+0.25, ...) opened on
 * ms's "small" in t; its id into id. */
static void open_filled(attnd_sessions *t, attnd_models *ms, char id[ATTND_SESSION_ID_LEN + 1]) {
    attnd_error e = {AOK, ""};
    attnd_version *v = attnd_models_get(ms, "small", &e);
    ck_assert_msg(v != NULL, "%s", e.msg);
    const attn_hparams *hp = &v->info.hp;
    attnd_cache_shape shape = attnd_session_cache_shape(hp->num_kv_heads, hp->head_dim, 0);
    attnd_session_step step;
    int retry = 0;
    ck_assert_int_eq(attnd_session_open(t, v, &shape, TOKENS, 1 << 20, 0, NULL, id, &step, &retry),
                     SESS_OK);
    float *kv = step.kv;
    size_t row = shape.row_bytes / sizeof(float);
    for (int i = 0; i < TOKENS; i++)
        for (size_t c = 0; c < row; c++)
            kv[(size_t)i * row + c] = (float)i + 0.25f * (float)c;
    attnd_session_end(t, &step, 1, 0);
    attnd_version_unref(v); /* the session holds it */
}

/* Session id of t as a state file, into out. */
static void export_state(attnd_sessions *t, attnd_models *ms, const char *id, attnd_sbuf *out) {
    attnd_parse_env env = {
        .models = ms, .max_tokens_per_request = 1 << 20, .max_attention_floats = 1 << 20};
    attnd_persist_env p = {t, &env};
    attnd_error e = {AOK, ""};
    attnd_sb_init(out);
    ck_assert_msg(attnd_session_export(&p, id, 0, out, &e) == 0, "%s", e.msg);
    ck_assert(!out->oom && out->len > 0);
}

/* The file restored in a new table over ms: its return, out and e. */
static int restore_into(attnd_sessions *t, attnd_models *ms, const attnd_sbuf *file,
                        attnd_restored *out, attnd_error *e) {
    attnd_parse_env env = {
        .models = ms, .max_tokens_per_request = 1 << 20, .max_attention_floats = 1 << 20};
    attnd_persist_env p = {t, &env};
    int retry = 0;
    return attnd_session_restore(&p, (const unsigned char *)file->p, file->len, NULL, 0, out, e,
                                 &retry);
}

START_TEST(test_restored_where_served) {
    attnd_models *here = table_of("small", &SMALL);
    attnd_sessions *a = sessions_new(), *b = sessions_new();
    char id[ATTND_SESSION_ID_LEN + 1];
    attnd_sbuf file, again;
    open_filled(a, here, id);
    export_state(a, here, id, &file);
    attnd_restored out;
    attnd_error e = {AOK, ""};
    ck_assert_msg(restore_into(b, here, &file, &out, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(out.name, "small");
    ck_assert_int_eq(out.tokens, TOKENS);
    ck_assert_str_ne(out.id, id); /* no X-Session-Id: a new one */
    export_state(b, here, out.id, &again);
    ck_assert_uint_eq(again.len, file.len);
    ck_assert_msg(memcmp(again.p, file.p, file.len) == 0, "the restored session's rows differ");
    attnd_sb_free(&file);
    attnd_sb_free(&again);
    attnd_sessions_free(a);
    attnd_sessions_free(b);
    attnd_models_free(here);
}
END_TEST

/* The model's name is served, not its weights: found by name, refused by
 * the fingerprint (the look-up that fails here is the fingerprint's, and
 * the one by name succeeds: its error is never written). */
START_TEST(test_other_weights_refused) {
    attnd_models *here = table_of("small", &SMALL), *other = table_of("small", &UNBIASED);
    attnd_sessions *a = sessions_new(), *b = sessions_new();
    char id[ATTND_SESSION_ID_LEN + 1];
    attnd_sbuf file;
    open_filled(a, here, id);
    export_state(a, here, id, &file);
    attnd_restored out;
    attnd_error e = {AOK, ""};
    ck_assert_int_eq(restore_into(b, other, &file, &out, &e), -1);
    ck_assert_int_eq(e.code, AERR_CONFLICT);
    ck_assert_msg(strstr(e.msg, "fingerprint") && strstr(e.msg, "'small'"), "%s", e.msg);
    attnd_session_stats st;
    attnd_sessions_stats(b, &st);
    ck_assert_int_eq(st.sessions, 0);
    attnd_sb_free(&file);
    attnd_sessions_free(a);
    attnd_sessions_free(b);
    attnd_models_free(here);
    attnd_models_free(other);
}
END_TEST

START_TEST(test_model_not_served_refused) {
    attnd_models *here = table_of("small", &SMALL), *elsewhere = table_of("big", &SMALL);
    attnd_sessions *a = sessions_new(), *b = sessions_new();
    char id[ATTND_SESSION_ID_LEN + 1];
    attnd_sbuf file;
    open_filled(a, here, id);
    export_state(a, here, id, &file);
    attnd_restored out;
    attnd_error e = {AOK, ""};
    ck_assert_int_eq(restore_into(b, elsewhere, &file, &out, &e), -1);
    ck_assert_int_eq(e.code, AERR_CONFLICT);
    ck_assert_msg(strstr(e.msg, "model 'small', which this server does not serve (loaded: big)"),
                  "%s", e.msg);
    attnd_sb_free(&file);
    attnd_sessions_free(a);
    attnd_sessions_free(b);
    attnd_models_free(here);
    attnd_models_free(elsewhere);
}
END_TEST

int main(void) {
    Suite *s = suite_create("server_persist");
    TCase *tc = tcase_create("restore");
    tcase_add_test(tc, test_restored_where_served);
    tcase_add_test(tc, test_other_weights_refused);
    tcase_add_test(tc, test_model_not_served_refused);
    suite_add_tcase(s, tc);
    return check_run(s);
}
