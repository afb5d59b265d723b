/* request.c - native bodies into attnd_job: POST /v1/attention, and a
 * session's open and steps (the v2 reader is v2.c, the checks both share
 * collect.c, the answers answer.c). See request.h. The body is a field
 * table below (NATIVE; the tensor object is tensor.c's), walked by
 * jsonin.c's attnd_jin_object. Unknown fields are refused (a typo like
 * "atention" must not silently return no attention), and so is a key
 * given twice (docs/api.md lists every such choice).
 */
#include "request.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collect.h"

/* Where a body kind's fields land: T_* roles are read by read_tensor. */
#define COLLECTED(field) offsetof(collected, field)

/* A tensor field of the native body (f->arg is its role). */
static int read_tensor(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    collected *c = dst;
    int role = f->arg;
    attnd_tensor_kind kind = role == T_KPM ? TK_BOOL : role == T_MASK ? TK_ANY : TK_FLOAT;
    int max_rank = role == T_KPM || role == T_POS ? 2 : 3;
    if (attnd_tensor_read(j, path->s, kind, max_rank, role == T_MASK, &c->t[role], e) < 0)
        return -1;
    c->given[role] = 1;
    return 0;
}

/* "model": a name, or null (as if absent). */
static int read_model(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    (void)f;
    collected *c = dst;
    int cut = 0;
    if (attnd_jin_next_type(j) == JT_NULL)
        return attnd_jin_null(j) < 0 ? attnd_jin_fail(j, path, e) : 0;
    if (attnd_jin_string_buf(j, c->model, sizeof(c->model), &cut) < 0)
        return attnd_jin_fail(j, path, e);
    if (cut)
        return attnd_set_error(e, AERR_NOT_FOUND, "unknown model (a name longer than %zu bytes)",
                               sizeof(c->model) - 1);
    c->have_model = 1;
    return 0;
}

#define TENSOR_FIELD(nm, role)                                                                     \
    {                                                                                              \
        .name = nm, .type = JF_CUSTOM, .read = read_tensor, .arg = role,                           \
        .accepts = 1u << JT_ARRAY | 1u << JT_OBJECT, .expects = "nested arrays or a tensor object" \
    }

// clang-format off
static const jfield NATIVE_FIELDS[] = {
    {.name = "model", .type = JF_CUSTOM, .read = read_model,
     .accepts = 1u << JT_STRING | 1u << JT_NULL, .expects = "a model name"},
    TENSOR_FIELD("query", T_QUERY),
    TENSOR_FIELD("key", T_KEY),
    TENSOR_FIELD("value", T_VALUE),
    {.name = "causal", .type = JF_BOOL_NULL, .offset = COLLECTED(causal)},
    TENSOR_FIELD("key_padding_mask", T_KPM),
    TENSOR_FIELD("attn_mask", T_MASK),
    TENSOR_FIELD("positions", T_POS),
    {.name = "attention", .type = JF_WORD, .offset = COLLECTED(weights), .words = &attnd_attention_modes},
    {.name = "encoding", .type = JF_WORD, .offset = COLLECTED(enc), .words = &attnd_encodings},
    TIMEOUT_FIELD("timeout_ms", COLLECTED(timeout_ms)),
    {.name = "attention_heads", .type = JF_CUSTOM, .read = attnd_sel_read_heads,
     .offset = COLLECTED(sel), .accepts = 1u << JT_ARRAY, .expects = "an array of head indices"},
    {.name = "attention_rows", .type = JF_CUSTOM, .read = attnd_sel_read_rows,
     .offset = COLLECTED(sel), .accepts = 1u << JT_ARRAY, .expects = "[start, end]"},
    {.name = "attention_top_k", .type = JF_CUSTOM, .read = attnd_sel_read_top_k,
     .offset = COLLECTED(sel), .accepts = 1u << JT_NUMBER, .expects = "a size (a whole number)"},
    {.name = "attention_dtype", .type = JF_WORD, .offset = COLLECTED(sel.dtype),
     .words = &attnd_attention_dtypes},
};
// clang-format on
/* Unknown fields are refused: a typo like "atention" must not silently
 * return no attention. */
static const jtable NATIVE = JTABLE_NULL_ABSENT("field", NATIVE_FIELDS, 0);

/* A native body of a kind (BODY_STEP: a session step's rows). */
static int parse_native(const attnd_parse_env *env, const char *path_model, attnd_version *pin,
                        body_kind kind, const char *body, size_t len, attnd_job *job,
                        attnd_error *e) {
    collected c;
    attnd_collected_init(&c, 0);
    c.pin = pin;
    memset(job, 0, sizeof(*job));
    int ret = -1;
    if (attnd_read_body(body, len, &NATIVE, &c, NULL, e) < 0) goto cleanup;
    if (c.weights < 0) c.weights = ATTN_WEIGHTS_NONE;
    if (attnd_build_job(env, path_model, &c, kind, job, e) < 0) goto cleanup;
    job->api = API_NATIVE;
    ret = 0;
cleanup:
    attnd_collected_free(&c);
    return ret;
}

int attnd_parse_native(const attnd_parse_env *env, const char *path_model, const char *body,
                       size_t len, attnd_job *job, attnd_error *e) {
    return parse_native(env, path_model, NULL, BODY_WHOLE, body, len, job, e);
}

int attnd_parse_session_open(const attnd_parse_env *env, const char *body, size_t len,
                             attnd_job *job, attnd_error *e) {
    collected c;
    attnd_collected_init(&c, 0);
    memset(job, 0, sizeof(*job));
    unsigned given = 0;
    int ret = -1;
    attnd_version *v = NULL;
    if (len > 0 && attnd_read_body(body, len, &NATIVE, &c, &given, e) < 0) goto cleanup;
    if (c.given[T_QUERY]) { /* the prefix: a native body like any other */
        if (c.weights < 0) c.weights = ATTN_WEIGHTS_NONE;
        if (attnd_build_job(env, NULL, &c, BODY_OPEN, job, e) < 0) goto cleanup;
        job->api = API_NATIVE;
        ret = 1;
        goto cleanup;
    }
    if (c.causal == 0) {
        attnd_set_error(e, AERR_BAD_REQUEST,
                        "causal: a session is always causal (each row sees the cache and the rows "
                        "before it); leave causal out or give true");
        goto cleanup;
    }
    for (int i = 0; i < NATIVE.n; i++)
        if ((given & 1u << i) && NATIVE.fields[i].read != read_model &&
            NATIVE.fields[i].read != attnd_read_timeout && NATIVE.fields[i].type != JF_BOOL_NULL) {
            attnd_set_error(e, AERR_BAD_REQUEST,
                            "%s: a session opened without a prefix takes only \"model\" (give "
                            "the prefix rows as \"query\")",
                            NATIVE.fields[i].name);
            goto cleanup;
        }
    if (!(v = attnd_resolve_model(env, NULL, &c, e))) goto cleanup;
    job->model = v->slot;
    job->ver = v;
    if (attnd_model_sessions_refusal(&v->info, e) < 0) {
        attnd_job_free(job);
        goto cleanup;
    }
    job->api = API_NATIVE;
    ret = 0;
cleanup:
    if (ret >= 0) job->session_open = 1;
    attnd_collected_free(&c);
    return ret;
}

int attnd_parse_session_step(const attnd_parse_env *env, attnd_version *ver, const char *id,
                             const char *body, size_t len, attnd_job *job, attnd_error *e) {
    if (parse_native(env, NULL, ver, BODY_STEP, body, len, job, e) < 0) return -1;
    if (!(job->session_id = strdup(id))) {
        attnd_job_free(job);
        return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    return 0;
}
