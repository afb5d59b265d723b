/* v2.c - Open Inference Protocol (KServe v2) infer bodies into attnd_job.
 * See v2.h. Each kind of object a body holds is a field table below (V2,
 * V2_INPUT, V2_OUTPUT and their parameters), walked by jsonin.c's
 * attnd_jin_object; inputs are filed under their roles (query, key, ...)
 * and the checks both APIs share are collect.c's. A body's unknown
 * top-level fields and parameters are ignored, as the protocol allows
 * extensions; an unknown key of an input is refused; a request that lists
 * outputs gets only those (docs/api.md).
 */
#include "v2.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collect.h"

/* One element of "inputs". */
typedef struct {
    char name[40];
    char datatype[16];
    jshape shape;
    attnd_tensor data;
    int have_data;
    int64_t bin_size; /* parameters.binary_data_size, or -1: data in the JSON */
} v2_input;

/* The binary part of a body (binary data extension): inputs take their
 * bytes from it in order. */
typedef struct {
    const unsigned char *p; /* next unread byte */
    size_t left;            /* bytes not yet taken */
} v2_bin;

/* One element of "outputs". */
typedef struct {
    char name[40];
    int binary; /* parameters.binary_data */
} v2_output;

/* What a v2 body is read into. */
typedef struct {
    collected c;
    char *id;     /* owned */
    int bin_all;  /* parameters.binary_data_output */
    int out_bits; /* outputs listed: V2_OUT_* bits */
    int bin_bits; /* of those, the binary ones */
    v2_bin bin;
    char labels[T_COUNT][48];
    v2_input in;         /* the input being read; its data owned */
    v2_output out;       /* the output being read */
    char session_id[40]; /* parameters.session_id: a step of that session, or "" */
    int session_open;    /* parameters.session_open: open a session with the query */
    int session_close;   /* parameters.session_close: close it after this step, or now */
} v2_body;

/* "data": nested arrays or flat, named with the input's name when known. */
static int read_v2_data(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    (void)f;
    v2_input *in = &((v2_body *)dst)->in;
    char label[160];
    if (in->name[0])
        snprintf(label, sizeof(label), "%.*s (%s).data", (int)(path->n - 5), path->s, in->name);
    else
        snprintf(label, sizeof(label), "%s", path->s);
    if (attnd_tensor_read(j, label, TK_ANY, TENSOR_MAX_RANK, 0, &in->data, e) < 0) return -1;
    in->have_data = 1;
    return 0;
}

#define V2_IN(field) offsetof(v2_body, in.field)
#define V2_OUT(field) offsetof(v2_body, out.field)

// clang-format off
static const jfield V2_INPUT_PARAMETER_FIELDS[] = {
    {.name = "binary_data_size", .type = JF_SIZE, .offset = V2_IN(bin_size),
     .max = (int64_t)1 << 50},
};
/* Other parameters are the protocol's extensions: skipped. */
static const jtable V2_INPUT_PARAMETERS = JTABLE("parameter", V2_INPUT_PARAMETER_FIELDS, 1);

static const jfield V2_INPUT_FIELDS[] = {
    {.name = "name", .type = JF_STRING, .required = 1, .offset = V2_IN(name),
     .size = sizeof(((v2_input *)0)->name)},
    {.name = "shape", .type = JF_SHAPE, .required = 1, .offset = V2_IN(shape),
     .max = TENSOR_MAX_DIM},
    {.name = "datatype", .type = JF_STRING, .required = 1, .offset = V2_IN(datatype),
     .size = sizeof(((v2_input *)0)->datatype)},
    {.name = "data", .type = JF_CUSTOM, .read = read_v2_data,
     .accepts = 1u << JT_ARRAY | 1u << JT_OBJECT, .expects = "an array of values"},
    {.name = "parameters", .type = JF_OBJECT, .table = &V2_INPUT_PARAMETERS},
};
static const jtable V2_INPUT = JTABLE("key", V2_INPUT_FIELDS, 0);

static const jfield V2_OUTPUT_PARAMETER_FIELDS[] = {
    {.name = "binary_data", .type = JF_BOOL, .offset = V2_OUT(binary)},
};
static const jtable V2_OUTPUT_PARAMETERS = JTABLE("parameter", V2_OUTPUT_PARAMETER_FIELDS, 1);

static const jfield V2_OUTPUT_FIELDS[] = {
    {.name = "name", .type = JF_STRING, .required = 1, .offset = V2_OUT(name),
     .size = sizeof(((v2_output *)0)->name)},
    {.name = "parameters", .type = JF_OBJECT, .table = &V2_OUTPUT_PARAMETERS},
};
static const jtable V2_OUTPUT = JTABLE("key", V2_OUTPUT_FIELDS, 1);
// clang-format on

/* Little-endian INT32 or INT64 elements (positions), or FP64 ones, as the
 * floats the checks read; integers past 2^24 round, which the position
 * limit refuses anyway, and doubles round to nearest as JSON numbers do.
 * Frees raw; NULL when out of memory. */
static float *wide_as_floats(void *raw, uint64_t n, int is_i64, int is_f64) {
    float *f = malloc(n ? (size_t)n * sizeof(float) : 1);
    for (uint64_t k = 0; f && k < n; k++) {
        int64_t v64;
        int32_t v32;
        double d;
        if (is_f64)
            memcpy(&d, (char *)raw + k * 8, 8);
        else if (is_i64)
            memcpy(&v64, (char *)raw + k * 8, 8);
        else
            memcpy(&v32, (char *)raw + k * 4, 4);
        f[k] = is_f64 ? (float)d : is_i64 ? (float)v64 : (float)v32;
    }
    free(raw);
    return f;
}

/* The bytes of a binary input (need of them, for n elements), checked
 * like JSON data: floats finite (-inf allowed in attn_mask), booleans 0
 * or 1. */
static int take_binary(v2_input *in, int idx, uint64_t n, uint64_t need, int is_bool, v2_bin *bin,
                       attnd_error *e) {
    int is_i32 = strcmp(in->datatype, "INT32") == 0, is_i64 = strcmp(in->datatype, "INT64") == 0;
    int is_f64 = strcmp(in->datatype, "FP64") == 0;
    if (!is_bool && !is_i32 && !is_i64 && !is_f64 && strcmp(in->datatype, "FP32") != 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): binary data must be FP32, FP64 or BOOL "
                               "(positions: INT32 or INT64), not %s",
                               idx, in->name, in->datatype);
    if ((uint64_t)in->bin_size != need)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): binary_data_size %lld where shape and datatype "
                               "need %llu",
                               idx, in->name, (long long)in->bin_size, (unsigned long long)need);
    if ((size_t)in->bin_size > bin->left)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): binary_data_size %lld, but %zu bytes of binary "
                               "data are left",
                               idx, in->name, (long long)in->bin_size, bin->left);
    attnd_tensor *t = &in->data;
    memset(t, 0, sizeof(*t));
    void *buf = malloc(in->bin_size ? (size_t)in->bin_size : 1);
    if (!buf) return attnd_set_error(e, AERR_INTERNAL, "out of memory reading %s", in->name);
    memcpy(buf, bin->p, (size_t)in->bin_size);
    bin->p += in->bin_size;
    bin->left -= (size_t)in->bin_size;
    t->n = (size_t)n;
    t->is_bool = is_bool;
    t->rank = in->shape.rank;
    for (int d = 0; d < in->shape.rank; d++)
        t->shape[d] = (int)in->shape.dim[d];
    if (is_bool) {
        t->u = buf;
        for (uint64_t k = 0; k < n; k++)
            t->u[k] = t->u[k] != 0;
        return 0;
    }
    t->f = is_i32 || is_i64 || is_f64 ? wide_as_floats(buf, n, is_i64, is_f64) : buf;
    if (!t->f) return attnd_set_error(e, AERR_INTERNAL, "out of memory reading %s", in->name);
    /* -inf hides a key in a float mask, as in a native tensor object */
    return attnd_tensor_check_finite(t, in->name, strcmp(in->name, "attn_mask") == 0, e);
}

/* The role an input's name gives it (T_*), or -1 with e set: an unknown
 * name, or a role given twice. */
static int role_of(const v2_input *in, int idx, const collected *c, attnd_error *e) {
    int ti = -1;
    for (int i = 0; i < T_COUNT; i++)
        if (strcmp(in->name, attnd_role_names[i]) == 0) ti = i;
    if (ti < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d].name: unknown input '%s' (query, key, value, "
                               "key_padding_mask, attn_mask, positions)",
                               idx, in->name);
    if (c->given[ti])
        return attnd_set_error(e, AERR_BAD_REQUEST, "inputs[%d]: input '%s' given twice", idx,
                               in->name);
    return ti;
}

/* The input's datatype against its role and its JSON data: *is_bool set. */
static int check_datatype(const v2_input *in, int idx, int ti, int *is_bool, attnd_error *e) {
    const char *dt = in->datatype;
    int is_float = strcmp(dt, "FP32") == 0 || strcmp(dt, "FP64") == 0 || strcmp(dt, "FP16") == 0 ||
                   (ti == T_POS && (strcmp(dt, "INT32") == 0 || strcmp(dt, "INT64") == 0));
    *is_bool = strcmp(dt, "BOOL") == 0;
    int want_float = ti <= T_VALUE, want_bool = ti == T_KPM;
    if ((!is_float && !*is_bool) || (want_float && !is_float) || (want_bool && !*is_bool))
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d].datatype: '%s' cannot carry %s (%s)", idx, dt, in->name,
                               want_float  ? "FP32"
                               : want_bool ? "BOOL"
                                           : "BOOL or FP32");
    if (in->have_data && in->data.is_bool != *is_bool) {
        /* the data took its kind from its first element: name that one */
        char at[3 * TENSOR_MAX_RANK + 1] = "";
        for (int d = 0; d < in->data.rank && d < TENSOR_MAX_RANK; d++)
            strcat(at, "[0]");
        return attnd_set_error(
            e, AERR_BAD_REQUEST, "inputs[%d] (%s).data%s: not %s (got %s); %s takes %s", idx,
            in->name, at, *is_bool ? "a boolean" : "a number", *is_bool ? "a number" : "a boolean",
            dt, *is_bool ? "true and false" : "numbers");
    }
    return 0;
}

/* Checks one input against its declared shape and datatype and files it
 * under its role, labelled "inputs[i] (role)" in later messages. */
static int file_v2_input(v2_input *in, int idx, collected *c, char labels[][48], v2_bin *bin,
                         attnd_error *e) {
    int is_bool, ti = role_of(in, idx, c, e);
    if (ti < 0 || check_datatype(in, idx, ti, &is_bool, e) < 0) return -1;
    if (in->shape.rank < 1 || in->shape.rank > 3)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s).shape: takes 1 to 3 dimensions, got %d", idx,
                               in->name, in->shape.rank);
    snprintf(labels[ti], 48, "inputs[%d] (%s)", idx, attnd_role_names[ti]);
    int wide = strcmp(in->datatype, "INT64") == 0 || strcmp(in->datatype, "FP64") == 0;
    size_t esz = is_bool ? 1 : wide ? 8 : 4; /* binary data */
    uint64_t n, bytes;
    if (attnd_tensor_size(&in->shape, esz, labels[ti], &n, &bytes, e) < 0) return -1;
    if (in->bin_size >= 0 && take_binary(in, idx, n, bytes, is_bool, bin, e) < 0) return -1;
    if (n != in->data.n)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): shape needs %llu values, data has %zu", idx,
                               in->name, (unsigned long long)n, in->data.n);
    attnd_tensor *t = &c->t[ti];
    *t = in->data;
    memset(&in->data, 0, sizeof(in->data));
    t->rank = in->shape.rank;
    t->shaped = 1;
    for (int d = 0; d < in->shape.rank; d++)
        t->shape[d] = (int)in->shape.dim[d];
    c->given[ti] = 1;
    c->label[ti] = labels[ti];
    return 0;
}

static int read_v2_input(jin *j, int idx, void *dst, jpath *path, attnd_error *e) {
    v2_body *v = dst;
    v2_input *in = &v->in;
    attnd_tensor_free(&in->data);
    memset(in, 0, sizeof(*in));
    in->bin_size = -1;
    if (attnd_jin_object(j, &V2_INPUT, v, path, NULL, e) < 0) return -1;
    if (in->have_data && in->bin_size >= 0)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: both data and parameters.binary_data_size",
                               path->s);
    if (!in->have_data && in->bin_size < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s.data: required (or parameters.binary_data_size with the "
                               "binary data extension)",
                               path->s);
    if (file_v2_input(in, idx, &v->c, v->labels, &v->bin, e) < 0) return -1;
    attnd_tensor_free(&in->data);
    return 0;
}

/* The outputs a model gives, as V2_OUT_* bits. */
static const attnd_enum_row V2_OUTPUT_NAMES[] = {
    {"output", V2_OUT_OUTPUT},
    {"attention", V2_OUT_ATTENTION},
    {"attention_topk_indices", V2_OUT_TOPK_INDICES},
    {"attention_topk_values", V2_OUT_TOPK_VALUES},
};
static const attnd_enum v2_output_names = ATTND_ENUM(V2_OUTPUT_NAMES);

/* An output asked for, by one of v2_output_names; anything else is an
 * output this model cannot give. */
static int read_v2_output(jin *j, int idx, void *dst, jpath *path, attnd_error *e) {
    (void)idx;
    v2_body *v = dst;
    memset(&v->out, 0, sizeof(v->out));
    if (attnd_jin_object(j, &V2_OUTPUT, v, path, NULL, e) < 0) return -1;
    int bit = 0;
    if (attnd_enum_value(&v2_output_names, v->out.name, &bit) < 0) {
        char names[160];
        return attnd_set_error(
            e, AERR_BAD_REQUEST, "%s.name: unknown output '%s' (the model gives %s)", path->s,
            v->out.name, attnd_enum_words(&v2_output_names, ", ", names, sizeof names));
    }
    if (v->out_bits & bit)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s.name: '%s' asked for twice", path->s,
                               v->out.name);
    v->out_bits |= bit;
    if (v->out.binary) v->bin_bits |= bit;
    return 0;
}

#define V2(field) offsetof(v2_body, field)

// clang-format off
static const jfield V2_PARAMETER_FIELDS[] = {
    {.name = "causal", .type = JF_BOOL_NULL, .offset = V2(c.causal)},
    {.name = "attention", .type = JF_WORD, .offset = V2(c.weights), .words = &attnd_attention_modes},
    {.name = "binary_data_output", .type = JF_BOOL, .offset = V2(bin_all)},
    {.name = "session_id", .type = JF_STRING, .offset = V2(session_id),
     .size = sizeof(((v2_body *)0)->session_id)},
    {.name = "session_open", .type = JF_BOOL, .offset = V2(session_open)},
    {.name = "session_close", .type = JF_BOOL, .offset = V2(session_close)},
    TIMEOUT_FIELD("timeout_ms", V2(c.timeout_ms)),
    {.name = "attention_heads", .type = JF_CUSTOM, .read = attnd_sel_read_v2_heads,
     .offset = V2(c.sel), .accepts = 1u << JT_STRING | 1u << JT_NUMBER,
     .expects = "a string of head indices such as \"0,3,5\""},
    {.name = "attention_rows", .type = JF_CUSTOM, .read = attnd_sel_read_v2_rows,
     .offset = V2(c.sel), .accepts = 1u << JT_STRING, .expects = "a string \"start:end\""},
    {.name = "attention_top_k", .type = JF_CUSTOM, .read = attnd_sel_read_top_k,
     .offset = V2(c.sel), .accepts = 1u << JT_NUMBER, .expects = "a size (a whole number)"}, 
    {.name = "attention_datatype", .type = JF_WORD, .offset = V2(c.sel.dtype),
     .words = &attnd_attention_datatypes},
};
static const jtable V2_PARAMETERS = JTABLE_NULL_ABSENT("parameter", V2_PARAMETER_FIELDS, 1);

static const jfield V2_FIELDS[] = {
    {.name = "id", .type = JF_STRDUP, .offset = V2(id)},
    {.name = "inputs", .type = JF_LIST, .each = read_v2_input}, /* query checked after */
    {.name = "outputs", .type = JF_LIST, .each = read_v2_output},
    {.name = "parameters", .type = JF_OBJECT, .table = &V2_PARAMETERS},
};
// clang-format on
/* Unknown top-level fields and parameters are skipped: the protocol allows
 * extensions. */
static const jtable V2 = JTABLE_NULL_ABSENT("field", V2_FIELDS, 1);

/* outputs and parameters.attention together: which outputs come back and
 * whether attention is computed. With attention_top_k the attention comes
 * as attention_topk_indices and attention_topk_values, not attention. */
static int v2_outputs(v2_body *v, attnd_error *e) {
    int topk = v->c.sel.top_k >= 0;
    int attn_bits = v->out_bits & (V2_OUT_ALL & ~V2_OUT_OUTPUT);
    const char *listed = attn_bits & V2_OUT_ATTENTION      ? "attention"
                         : attn_bits & V2_OUT_TOPK_INDICES ? "attention_topk_indices"
                                                           : "attention_topk_values";
    if (topk && (attn_bits & V2_OUT_ATTENTION))
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "outputs: 'attention' is asked for, but parameters.attention_top_k "
                               "answers attention_topk_indices and attention_topk_values");
    if (!topk && (attn_bits & ~V2_OUT_ATTENTION))
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "outputs: '%s' is asked for, but it needs "
                               "parameters.attention_top_k",
                               listed);
    if (!attn_bits) {
        if (v->out_bits) v->c.weights = ATTN_WEIGHTS_NONE; /* attention not listed: not computed */
        if (v->c.weights < 0) v->c.weights = ATTN_WEIGHTS_NONE;
        return 0;
    }
    if (v->c.weights == ATTN_WEIGHTS_NONE)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "outputs: '%s' is asked for, but parameters.attention is \"none\"",
                               listed);
    if (v->c.weights < 0) v->c.weights = ATTN_WEIGHTS_MEAN;
    return 0;
}

static int any_input(const collected *c) {
    for (int i = 0; i < T_COUNT; i++)
        if (c->given[i]) return 1;
    return 0;
}

/* The 400 of parameters.session_close without the session_id it closes
 * (with inputs too: else it would be an ordinary infer that closes
 * nothing; session_open with inputs gives the session it closes). */
static int close_without_id(attnd_error *e) {
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "parameters.session_close: closes the session of "
                           "parameters.session_id, which is missing");
}

/* parameters.session_close with no input: the session closes now (admit.c
 * answers it); the job names the model and the session, and holds the
 * model's version as any job does. */
static int close_only(const attnd_parse_env *env, const char *path_model, v2_body *v,
                      attnd_job *job, attnd_error *e) {
    if (!v->session_id[0]) return close_without_id(e);
    if (v->session_open || v->out_bits)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "parameters.session_close: without inputs it closes a session, and "
                               "takes no %s",
                               v->session_open ? "session_open" : "outputs");
    attnd_version *ver = attnd_resolve_model(env, path_model, &v->c, e);
    if (!ver) return -1;
    job->ver = ver;
    job->model = ver->slot;
    job->api = API_V2;
    job->session_close = 1;
    job->v2_id = v->id;
    v->id = NULL;
    if (!(job->session_id = strdup(v->session_id))) {
        attnd_job_free(job);
        return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    return 0;
}

/* The body's JSON (json_len bytes of len when the binary data extension
 * follows it, else all) into v; a step's session's version pinned, when
 * the session is held (a step or close then runs on it, whatever serves). */
static int read_v2(const attnd_parse_env *env, const char *body, size_t len, size_t json_len,
                   v2_body *v, attnd_error *e) {
    if (json_len > len)
        return attnd_set_error(
            e, AERR_BAD_REQUEST,
            "Inference-Header-Content-Length %zu is more than the %zu bytes of the body", json_len,
            len);
    if (json_len) { /* binary data extension: JSON, then the tensors' bytes */
        v->bin.p = (const unsigned char *)body + json_len;
        v->bin.left = len - json_len;
        len = json_len;
    }
    if (attnd_read_body(body, len, &V2, v, NULL, e) < 0) return -1;
    if (v->session_id[0] && env->session_version)
        v->c.pin = env->session_version(env->session_arg, v->session_id);
    return 0;
}

int attnd_parse_v2(const attnd_parse_env *env, const char *path_model, const char *body, size_t len,
                   size_t json_len, attnd_job *job, attnd_error *e) {
    v2_body v;
    memset(&v, 0, sizeof(v));
    attnd_collected_init(&v.c, 1);
    memset(job, 0, sizeof(*job));
    int ret = -1;
    if (read_v2(env, body, len, json_len, &v, e) < 0) goto cleanup;
    if (!v.c.given[T_QUERY] && v.session_close && !any_input(&v.c)) {
        ret = close_only(env, path_model, &v, job, e);
        goto cleanup;
    }
    if (!v.c.given[T_QUERY]) {
        attnd_set_error(e, AERR_BAD_REQUEST, "inputs: an input named 'query' is required");
        goto cleanup;
    }
    if (v.session_close && !v.session_id[0] && !v.session_open) {
        close_without_id(e);
        goto cleanup;
    }
    if (v.bin.left) {
        attnd_set_error(e, AERR_BAD_REQUEST,
                        "%zu bytes of binary data after the inputs' binary_data_size", v.bin.left);
        goto cleanup;
    }
    if (v2_outputs(&v, e) < 0) goto cleanup;
    v.c.causal_label = "parameters.causal";
    body_kind kind = v.session_id[0] ? BODY_STEP : v.session_open ? BODY_OPEN : BODY_WHOLE;
    if (attnd_build_job(env, path_model, &v.c, kind, job, e) < 0) goto cleanup;
    job->api = API_V2;
    job->v2_outputs = v.out_bits;
    job->v2_binary = v.bin_all ? V2_OUT_ALL : v.bin_bits;
    job->v2_id = v.id;
    v.id = NULL;
    job->session_open = v.session_open;
    job->session_close = v.session_close;
    if (v.session_id[0] && !(job->session_id = strdup(v.session_id))) {
        attnd_job_free(job);
        attnd_set_error(e, AERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    ret = 0;
cleanup:
    attnd_tensor_free(&v.in.data);
    free(v.id);
    attnd_version_unref(v.c.pin);
    attnd_collected_free(&v.c);
    return ret;
}
