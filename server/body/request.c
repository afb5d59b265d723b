/* request.c - native and Open Inference Protocol bodies into attnd_job (the
 * answers are answer.c's). See request.h. Each kind of object a
 * body holds is a field table below (NATIVE, V2, V2_INPUT, V2_OUTPUT and
 * their parameters; the tensor object is tensor.c's), walked by jsonin.c's
 * attnd_jin_object; what is checked across fields is checked here.
 *
 * Choices where the contract is silent (docs/api.md repeats them):
 * - unknown fields of a native body are refused (a typo like "atention"
 *   must not silently return no attention); a v2 body's unknown top-level
 *   fields and parameters are ignored, as the protocol allows extensions;
 *   an unknown key of a v2 input is refused;
 * - a key given twice is refused in every object;
 * - a v2 request that lists outputs gets only those;
 * - key_padding_mask is booleans only (0/1 numbers are refused: a
 *   tokenizer's attention_mask means the opposite);
 * - key_padding_mask (S) and attn_mask (L,S) apply to every sequence of a
 *   batched query; (B,S) and (B,L,S) give one per sequence;
 * - value without key is refused; key without value means value = key.
 */
#include "request.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/sizes.h"
#include "../codec/jsonin.h"
#include "../codec/tensor.h"
#include "selection.h"

/* The tensors a body may carry, by role. */
enum { T_QUERY, T_KEY, T_VALUE, T_KPM, T_MASK, T_POS, T_COUNT };
static const char *const TNAME[T_COUNT] = {"query",     "key",      "value", "key_padding_mask",
                                           "attn_mask", "positions"};

/* What a body is: a whole request, a session's open with a prefix, or a
 * session step (whose keys are known at admission only). */
typedef enum { BODY_WHOLE, BODY_OPEN, BODY_STEP } body_kind;

/* What both parsers collect before the common checks. */
typedef struct {
    attnd_tensor t[T_COUNT];
    int given[T_COUNT];
    const char *label[T_COUNT]; /* how messages name the tensor */
    char model[ATTND_NAME_MAX + 8];
    int have_model;
    int causal;               /* 1, 0, or -1: the model's default */
    int weights;              /* attn_weights_mode, or -1 when the body did not say */
    int enc;                  /* attnd_encoding */
    int timeout_ms;           /* timeout_ms, 0 when not given */
    const char *causal_label; /* how messages name causal: "causal", "parameters.causal" */
    attnd_sel_in sel;         /* attention_heads, _rows, _top_k, _dtype as given */
} collected;

static void collected_free(collected *c) {
    for (int i = 0; i < T_COUNT; i++)
        attnd_tensor_free(&c->t[i]);
    attnd_sel_in_free(&c->sel);
}

static const attnd_enum_row ATTENTION_MODES[] = {
    {"none", ATTN_WEIGHTS_NONE},
    {"mean", ATTN_WEIGHTS_MEAN},
    {"heads", ATTN_WEIGHTS_HEADS},
};
const attnd_enum attnd_attention_modes = ATTND_ENUM(ATTENTION_MODES);

static const attnd_enum_row ENCODINGS[] = {
    {"json", ENC_JSON},
    {"base64", ENC_BASE64},
};
const attnd_enum attnd_encodings = ATTND_ENUM(ENCODINGS);

long long attnd_job_tokens(const attnd_job *job) {
    return (long long)job->B * ((long long)job->L + job->S);
}

uint64_t attnd_attention_floats(int B, int L, int S, attn_weights_mode mode, int H) {
    uint64_t r;
    if (sz_mul((uint64_t)B, (uint64_t)L, UINT64_MAX, &r) < 0 ||
        sz_mul(r, (uint64_t)S, UINT64_MAX, &r) < 0 ||
        sz_mul(r, mode == ATTN_WEIGHTS_HEADS ? (uint64_t)H : 1, UINT64_MAX, &r) < 0)
        return UINT64_MAX;
    return mode == ATTN_WEIGHTS_NONE ? 0 : r;
}

uint64_t attnd_job_attention_floats(const attnd_job *job, int H) {
    const attnd_attn_select *sel = &job->sel;
    int rows = sel->row1 ? sel->row1 - sel->row0 : job->L;
    int width = sel->top_k ? sel->top_k : job->S;
    return attnd_attention_floats(job->B, rows, width, job->weights, sel->heads ? sel->n_heads : H);
}

int attnd_attention_limit(const attnd_parse_env *env, const attnd_job *job, int session,
                          attnd_error *e) {
    uint64_t n = attnd_job_attention_floats(job, env->models[job->model].hp.num_heads);
    long long max = env->max_attention_floats;
    if (n <= (uint64_t)max) return 0;
    if (session)
        return attnd_set_error(e, AERR_TOO_LARGE,
                               "attention: %d rows over %d cached tokens ask for %llu floats, more "
                               "than %lld (limits.max_attention_floats); ask for \"none\" or "
                               "\"mean\", or select heads, rows or top-k",
                               job->L, job->S, (unsigned long long)n, max);
    return attnd_set_error(e, AERR_TOO_LARGE,
                           "attention answer of %s%llu floats, the limit is %lld "
                           "(limits.max_attention_floats); select heads, rows or top-k to ask "
                           "for less",
                           n == UINT64_MAX ? "more than " : "", (unsigned long long)n, max);
}

void attnd_job_drop_inputs(attnd_job *job) {
    free(job->query);
    free(job->key);
    free(job->value);
    job->query = job->key = job->value = NULL;
}

void attnd_job_free(attnd_job *job) {
    if (!job) return;
    attnd_job_drop_inputs(job);
    free(job->kpm);
    free(job->mask_bool);
    free(job->mask_add);
    free(job->positions);
    free(job->v2_id);
    free(job->session_id);
    free(job->sel.heads);
    free(job->attn);
    free(job->attn_idx);
    memset(job, 0, sizeof(*job));
}

/* "a, b, c": the loaded models' names, for messages (cut to fit). */
static const char *loaded_names(const attnd_parse_env *env, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < env->n_models && n < cap; i++) {
        int k = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", env->models[i].name);
        n += k > 0 ? (size_t)k : 0;
    }
    if (n >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
    return buf;
}

int attnd_find_model(const attnd_parse_env *env, const char *name, attnd_error *e) {
    for (int i = 0; i < env->n_models; i++)
        if (strcmp(env->models[i].name, name) == 0) return i;
    char names[160];
    return attnd_set_error(e, AERR_NOT_FOUND, "unknown model '%.64s' (loaded: %s)", name,
                           loaded_names(env, names, sizeof(names)));
}

/* Picks the model from the path and the body. */
static int resolve_model(const attnd_parse_env *env, const char *path_model, const collected *c,
                         attnd_error *e) {
    char names[160];
    if (path_model) {
        int m = attnd_find_model(env, path_model, e);
        if (m < 0) return -1;
        if (c->have_model && strcmp(c->model, path_model) != 0)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "model: '%s' does not match '%s' in the path", c->model,
                                   path_model);
        return m;
    }
    if (c->have_model) return attnd_find_model(env, c->model, e);
    if (env->n_models == 1) return 0;
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "model: required when more than one model is loaded (loaded: %s)",
                           loaded_names(env, names, sizeof(names)));
}

static float *take_f(attnd_tensor *t) {
    float *f = t->f;
    t->f = NULL;
    return f;
}

static uint8_t *take_u(attnd_tensor *t) {
    uint8_t *u = t->u;
    t->u = NULL;
    return u;
}

/* positions (rotary models only): L or B×L whole numbers from 0 to below
 * the model's max_positions (2^24 without one: float32 holds them exactly).
 * Without them a sequence's rows are at 0..L-1, which must fit too. */
static int check_positions(const collected *c, const attnd_model_info *m, int B, int L,
                           attnd_error *e) {
    const attnd_tensor *p = &c->t[T_POS];
    const char *lb = c->label[T_POS];
    long long limit = m->max_positions ? m->max_positions : 1LL << 24;
    if (m->hp.rope.dim && c->given[T_KEY])
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: model '%s' has rotary positions, which need self-attention "
                               "(a key row would have no position); give no key",
                               c->label[T_KEY], m->name);
    if (!c->given[T_POS]) {
        if (m->hp.rope.dim && L > limit)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "query: %d rows sit at positions 0..%d, past the model's "
                                   "max_positions %lld",
                                   L, L - 1, limit);
        return 0;
    }
    if (!m->hp.rope.dim)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: model '%s' has no rotary positions (no rope in its config)", lb,
                               m->name);
    if (p->is_bool || !((p->rank == 1 && p->shape[0] == L) ||
                        (p->rank == 2 && p->shape[0] == B && p->shape[1] == L)))
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: expected %d whole numbers (L) or %d×%d (B×L)", lb, L, B, L);
    uint64_t n = (uint64_t)L; /* B·L: at most the tensor's elements, checked all the same */
    if (p->rank == 2 && sz_mul((uint64_t)B, (uint64_t)L, (uint64_t)p->n, &n) < 0)
        return attnd_set_error(e, AERR_TOO_LARGE, "%s: %d×%d positions are too many", lb, B, L);
    for (uint64_t i = 0; i < n; i++) {
        float v = p->f[i];
        if (!(v >= 0) || v != floorf(v) || v >= (float)limit) {
            char at[128], num[40];
            attnd_tensor_index_name(at, sizeof(at), lb, p->rank, p->shape, (size_t)i);
            /* a whole number as its digits (16777216, never 1.67772e+07) */
            snprintf(num, sizeof num, v == floorf(v) && fabsf(v) < 1e15f ? "%.0f" : "%.9g",
                     (double)v);
            return attnd_set_error(
                e, AERR_BAD_REQUEST, "%s: %s is not a whole number from 0 to %lld (%s)", at, num,
                limit - 1, m->max_positions ? "the model's max_positions" : "2^24");
        }
    }
    return 0;
}

/* The job's positions (B×L int32) from a checked L or B×L tensor. */
static int32_t *positions_of(const attnd_tensor *p, int B, int L) {
    int32_t *out = malloc(sizeof(int32_t) * (size_t)B * (size_t)L);
    if (!out) return NULL;
    for (size_t i = 0; i < (size_t)B * (size_t)L; i++)
        out[i] = (int32_t)p->f[p->rank == 1 ? i % (size_t)L : i];
    return out;
}

/* ---- build_job's steps: each checks one part of what the body holds
 * against the model, in the order the refusals are given, and notes what
 * it learnt in job (its dimensions before its buffers) ---- */

/* The query: L×E or B×L×E rows of embed_dim numbers. Sets B, L, rank3. */
static int check_query(const collected *c, const attnd_model_info *m, attnd_job *job,
                       attnd_error *e) {
    const attnd_tensor *q = &c->t[T_QUERY];
    const char *lb = c->label[T_QUERY];
    if (!c->given[T_QUERY]) return attnd_set_error(e, AERR_BAD_REQUEST, "query: required");
    if (q->rank != 2 && q->rank != 3)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected L×E or B×L×E, got %d dimension%s",
                               lb, q->rank, q->rank == 1 ? "" : "s");
    job->rank3 = q->rank == 3;
    job->B = job->rank3 ? q->shape[0] : 1;
    job->L = q->shape[q->rank - 2];
    if (q->shape[q->rank - 1] != m->hp.embed_dim)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: rows have %d numbers, model '%s' has embed_dim %d", lb,
                               q->shape[q->rank - 1], m->name, m->hp.embed_dim);
    return 0;
}

/* One role, key or value, when given: the query's rank and batch, `rows`
 * rows when rows > 0 (a value has the key's), each of `width` numbers (the
 * model's `dim`). */
static int check_role(const collected *c, int role, const attnd_job *job, int rows, int width,
                      const char *dim, const attnd_model_info *m, attnd_error *e) {
    const attnd_tensor *t = &c->t[role];
    int qrank = c->t[T_QUERY].rank;
    const char *lb = c->label[role];
    if (t->rank != qrank)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: has %d dimensions where query has %d", lb,
                               t->rank, qrank);
    if (job->rank3 && t->shape[0] != job->B)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: batch of %d where query has %d", lb,
                               t->shape[0], job->B);
    if (rows > 0 && t->shape[t->rank - 2] != rows)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: %d rows where key has %d", lb,
                               t->shape[t->rank - 2], rows);
    if (t->shape[t->rank - 1] != width)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: rows have %d numbers, model '%s' has %s %d", lb,
                               t->shape[t->rank - 1], m->name, dim, width);
    return 0;
}

/* key and value against the model: self-attention without a key (the
 * model's widths must allow it), value = key without a value. Sets S and
 * self. */
static int check_key_value(const collected *c, const attnd_model_info *m, attnd_job *job,
                           attnd_error *e) {
    const attn_hparams *hp = &m->hp;
    job->self = !c->given[T_KEY];
    job->S = job->L;
    if (c->given[T_VALUE] && !c->given[T_KEY])
        return attnd_set_error(e, AERR_BAD_REQUEST, "value: given without key");
    if (c->given[T_KEY]) {
        if (check_role(c, T_KEY, job, 0, hp->kdim, "kdim", m, e) < 0) return -1;
        job->S = c->t[T_KEY].shape[c->t[T_KEY].rank - 2];
    } else if (hp->kdim != hp->embed_dim || hp->vdim != hp->embed_dim) {
        return attnd_set_error(
            e, AERR_BAD_REQUEST,
            "key: required, model '%s' has kdim %d and vdim %d, not embed_dim %d", m->name,
            hp->kdim, hp->vdim, hp->embed_dim);
    }
    if (c->given[T_VALUE]) return check_role(c, T_VALUE, job, job->S, hp->vdim, "vdim", m, e);
    if (c->given[T_KEY] && hp->vdim != hp->kdim)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "value: required, model '%s' has vdim %d, not kdim %d", m->name,
                               hp->vdim, hp->kdim);
    return 0;
}

/* key_padding_mask, positions and attn_mask against B, L and S. Sets
 * mask_per_seq. */
static int check_masks(const collected *c, const attnd_model_info *m, attnd_job *job,
                       attnd_error *e) {
    const attnd_tensor *kpm = &c->t[T_KPM], *am = &c->t[T_MASK];
    int B = job->B, L = job->L, S = job->S;
    if (c->given[T_KPM]) {
        if (!kpm->is_bool)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected booleans (true = hidden)",
                                   c->label[T_KPM]);
        int ok = (kpm->rank == 1 && kpm->shape[0] == S) ||
                 (kpm->rank == 2 && kpm->shape[0] == B && kpm->shape[1] == S);
        if (!ok)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "%s: expected %d booleans (S) or %d×%d (B×S)", c->label[T_KPM],
                                   S, B, S);
    }
    if (check_positions(c, m, B, L, e) < 0) return -1;
    if (c->given[T_MASK]) {
        int ok2 = am->rank == 2 && am->shape[0] == L && am->shape[1] == S;
        int ok3 = am->rank == 3 && am->shape[0] == B && am->shape[1] == L && am->shape[2] == S;
        if (!ok2 && !ok3)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected %d×%d (L×S) or %d×%d×%d",
                                   c->label[T_MASK], L, S, B, L, S);
        job->mask_per_seq = ok3;
    }
    return 0;
}

/* The request's tokens and attention matrices against the limits (413). */
static int check_limits(const attnd_parse_env *env, const attnd_job *job, attnd_error *e) {
    /* B, L, S < 2^31: B·(L+S) < 2^63 cannot wrap, but goes through the one helper */
    uint64_t tokens;
    sz_add((uint64_t)job->L, (uint64_t)job->S, UINT64_MAX, &tokens);
    sz_mul((uint64_t)job->B, tokens, UINT64_MAX, &tokens);
    if (tokens > (uint64_t)env->max_tokens_per_request)
        return attnd_set_error(e, AERR_TOO_LARGE,
                               "request has %llu query and key tokens, the limit is %d",
                               (unsigned long long)tokens, env->max_tokens_per_request);
    return attnd_attention_limit(env, job, 0, e);
}

/* The checked tensors, moved from c into job; a key_padding_mask of S
 * given for a batch is copied for every sequence. On failure (out of
 * memory) job is freed. */
static int move_tensors(collected *c, attnd_job *job, attnd_error *e) {
    attnd_tensor *kpm = &c->t[T_KPM], *am = &c->t[T_MASK];
    job->query = take_f(&c->t[T_QUERY]);
    if (c->given[T_KEY]) job->key = take_f(&c->t[T_KEY]);
    if (c->given[T_VALUE]) job->value = take_f(&c->t[T_VALUE]);
    if (c->given[T_KPM] && kpm->rank == 1 && job->B > 1) { /* one mask for every sequence */
        job->kpm = malloc((size_t)job->B * (size_t)job->S);
        if (!job->kpm) goto oom;
        for (int b = 0; b < job->B; b++)
            memcpy(job->kpm + (size_t)b * job->S, kpm->u, (size_t)job->S);
    } else if (c->given[T_KPM]) {
        job->kpm = take_u(kpm);
    }
    if (c->given[T_MASK] && am->is_bool) job->mask_bool = take_u(am);
    if (c->given[T_MASK] && !am->is_bool) job->mask_add = take_f(am);
    if (c->given[T_POS] && !(job->positions = positions_of(&c->t[T_POS], job->B, job->L))) goto oom;
    return 0;
oom:
    attnd_job_free(job);
    return attnd_set_error(e, AERR_INTERNAL, "out of memory");
}

int attnd_model_sessions_refusal(const attnd_model_info *m, attnd_error *e) {
    const attn_hparams *hp = &m->hp;
    if (hp->kdim == hp->embed_dim && hp->vdim == hp->embed_dim) return 0;
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "model '%s' cannot hold sessions: its kdim %d and vdim %d differ from "
                           "its embed_dim %d, and a session's rows are their own keys and values "
                           "(self-attention); send whole requests with a key and value to "
                           "/v1/attention",
                           m->name, hp->kdim, hp->vdim, hp->embed_dim);
}

/* The refusal of a session's rows that carry more than query rows: the
 * field named, and what a session takes instead. */
static int session_extra(const char *field, attnd_error *e) {
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "%s: a session step takes query rows only: no key, value, "
                           "key_padding_mask, attn_mask or positions (it is causal over the "
                           "cache, its rows at the positions after it)",
                           field);
}

/* What a session's rows (an open's prefix, a step) may not carry, refused
 * before any shape is checked, so that no message names a shape a session
 * would then refuse anyway; and causal false (a session is always causal). */
static int check_session_body(const collected *c, const attnd_model_info *m, attnd_error *e) {
    if (attnd_model_sessions_refusal(m, e) < 0) return -1;
    static const int extras[] = {T_KEY, T_VALUE, T_KPM, T_MASK, T_POS};
    for (size_t i = 0; i < countof(extras); i++)
        if (c->given[extras[i]]) return session_extra(c->label[extras[i]], e);
    if (c->causal == 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: a session is always causal (each row sees the cache and the "
                               "rows before it); leave causal out or give true",
                               c->causal_label);
    return 0;
}

/* The checks both APIs share, in named steps: the model, the query, key and
 * value, the masks, the attention selection, the limits; then the tensors
 * move into job. A session's rows (kind BODY_OPEN, BODY_STEP) are checked
 * for what a session takes first; a step's top-k is checked against its
 * keys at admission. job holds nothing to free after a failure. */
static int build_job(const attnd_parse_env *env, const char *path_model, collected *c,
                     body_kind kind, attnd_job *job, attnd_error *e) {
    memset(job, 0, sizeof(*job));
    int mi = resolve_model(env, path_model, c, e);
    if (mi < 0) return -1;
    const attnd_model_info *m = &env->models[mi];
    if (kind != BODY_WHOLE && check_session_body(c, m, e) < 0) return -1;
    job->model = mi;
    job->causal = c->causal < 0 ? m->hp.causal : c->causal;
    job->weights = c->weights;
    job->enc = c->enc;
    job->timeout_ms = c->timeout_ms;
    if (check_query(c, m, job, e) < 0 || check_key_value(c, m, job, e) < 0 ||
        check_masks(c, m, job, e) < 0 ||
        attnd_sel_check(&c->sel, m, job, kind == BODY_STEP, e) < 0 ||
        check_limits(env, job, e) < 0 || move_tensors(c, job, e) < 0) {
        free(job->sel.heads); /* move_tensors frees the whole job when it fails */
        memset(job, 0, sizeof(*job));
        return -1;
    }
    return 0;
}

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

/* "timeout_ms" (v2: parameters.timeout_ms): the request's own deadline, a
 * whole number of milliseconds, 1 or more; past INT_MAX it is INT_MAX (the
 * smaller of it and server.request_timeout_ms holds anyway). */
static int read_timeout(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    int *out = (int *)((char *)dst + f->offset);
    double v;
    size_t at = attnd_jin_offset(j);
    if (attnd_jin_number(j, &v) < 0) return attnd_jin_fail(j, path, e);
    if (!(v >= 1) || v != floor(v)) {
        size_t n = attnd_jin_offset(j) - at;
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: expected a whole number of milliseconds, 1 or more, got %.*s",
                               path->s, (int)(n < 40 ? n : 40), attnd_jin_body(j) + at);
    }
    *out = v >= (double)INT_MAX ? INT_MAX : (int)v;
    return 0;
}

#define TIMEOUT_FIELD(nm, off)                                                                     \
    {                                                                                              \
        .name = nm, .type = JF_CUSTOM, .read = read_timeout, .offset = off,                        \
        .accepts = 1u << JT_NUMBER, .expects = "a whole number of milliseconds, 1 or more"         \
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
    {.name = "attention_top_k", .type = JF_SIZE, .offset = COLLECTED(sel.top_k),
     .max = ATTND_SEL_MAX},
    {.name = "attention_dtype", .type = JF_WORD, .offset = COLLECTED(sel.dtype),
     .words = &attnd_attention_dtypes},
};
// clang-format on
/* Unknown fields are refused: a typo like "atention" must not silently
 * return no attention. */
static const jtable NATIVE = JTABLE("field", NATIVE_FIELDS, 0);

static void collected_init(collected *c, int v2) {
    memset(c, 0, sizeof(*c));
    c->causal = -1;
    c->weights = -1;
    for (int i = 0; i < T_COUNT; i++)
        c->label[i] = TNAME[i];
    c->causal_label = "causal";
    attnd_sel_in_init(&c->sel, v2);
}

/* What a body that is not a JSON object looks like, when it is something
 * else a client might send by mistake. */
static const char *looks_like(const char *body, size_t len) {
    while (len && (*body == ' ' || *body == '\r' || *body == '\n' || *body == '\t'))
        body++, len--;
    if (len >= 2 && body[0] == '-' && body[1] == '-')
        return "a multipart form (it starts with a \"--\" boundary)";
    size_t k = 0;
    while (k < len && (body[k] == '_' || body[k] == '.' || body[k] == '-' || body[k] == '%' ||
                       body[k] == '+' || (body[k] >= '0' && body[k] <= '9') ||
                       (body[k] >= 'a' && body[k] <= 'z') || (body[k] >= 'A' && body[k] <= 'Z')))
        k++;
    if (k > 0 && k < len && body[k] == '=' && !(body[0] >= '0' && body[0] <= '9') && body[0] != '-')
        return "an HTML form (name=value&...)";
    return NULL;
}

/* A reader on a body that must be one JSON object, standing at it. NULL
 * with e set when the body is anything else. */
static jin *body_reader(const char *body, size_t len, attnd_error *e) {
    jin *j = attnd_jin_new(body, len);
    if (!j) {
        attnd_set_error(e, AERR_INTERNAL, "out of memory");
        return NULL;
    }
    jin_type type = attnd_jin_next_type(j);
    if (type == JT_OBJECT) return j;
    const char *like = looks_like(body, len);
    if (type == JT_END)
        attnd_set_error(e, AERR_BAD_REQUEST, "body is empty: it must be a JSON object");
    else if (like)
        attnd_set_error(e, AERR_BAD_REQUEST,
                        "body must be JSON (Content-Type: application/json), not %s", like);
    else if (attnd_jin_skip(j) < 0)
        attnd_jin_fail(j, NULL, e);
    else
        attnd_set_error(e, AERR_BAD_REQUEST, "body must be a JSON object, not %s",
                        type == JT_ARRAY ? "an array" : "a single value");
    attnd_jin_free(j);
    return NULL;
}

/* The whole body against table t into dst, and nothing after it. given, when
 * not NULL, gets the fields that were there (attnd_jin_object). */
static int read_body(const char *body, size_t len, const jtable *t, void *dst, unsigned *given,
                     attnd_error *e) {
    jin *j = body_reader(body, len, e);
    if (!j) return -1;
    jpath path;
    attnd_jpath_init(&path, "");
    int rc = attnd_jin_object(j, t, dst, &path, given, e);
    if (rc == 0 && attnd_jin_end(j) < 0) rc = attnd_jin_fail(j, NULL, e);
    attnd_jin_free(j);
    return rc;
}

/* A native body of a kind (BODY_STEP: a session step's rows). */
static int parse_native(const attnd_parse_env *env, const char *path_model, body_kind kind,
                        const char *body, size_t len, attnd_job *job, attnd_error *e) {
    collected c;
    collected_init(&c, 0);
    memset(job, 0, sizeof(*job));
    int ret = -1;
    if (read_body(body, len, &NATIVE, &c, NULL, e) < 0) goto cleanup;
    if (c.weights < 0) c.weights = ATTN_WEIGHTS_NONE;
    if (build_job(env, path_model, &c, kind, job, e) < 0) goto cleanup;
    job->api = API_NATIVE;
    ret = 0;
cleanup:
    collected_free(&c);
    return ret;
}

int attnd_parse_native(const attnd_parse_env *env, const char *path_model, const char *body,
                       size_t len, attnd_job *job, attnd_error *e) {
    return parse_native(env, path_model, BODY_WHOLE, body, len, job, e);
}

int attnd_parse_session_open(const attnd_parse_env *env, const char *body, size_t len,
                             attnd_job *job, attnd_error *e) {
    collected c;
    collected_init(&c, 0);
    memset(job, 0, sizeof(*job));
    unsigned given = 0;
    int ret = -1, mi;
    if (len > 0 && read_body(body, len, &NATIVE, &c, &given, e) < 0) goto cleanup;
    if (c.given[T_QUERY]) { /* the prefix: a native body like any other */
        if (c.weights < 0) c.weights = ATTN_WEIGHTS_NONE;
        if (build_job(env, NULL, &c, BODY_OPEN, job, e) < 0) goto cleanup;
        job->api = API_NATIVE;
        ret = 1;
        goto cleanup;
    }
    for (int i = 0; i < NATIVE.n; i++)
        if ((given & 1u << i) && NATIVE.fields[i].read != read_model &&
            NATIVE.fields[i].read != read_timeout) {
            attnd_set_error(e, AERR_BAD_REQUEST,
                            "%s: a session opened without a prefix takes only \"model\" (give "
                            "the prefix rows as \"query\")",
                            NATIVE.fields[i].name);
            goto cleanup;
        }
    if ((mi = resolve_model(env, NULL, &c, e)) < 0 ||
        attnd_model_sessions_refusal(&env->models[mi], e) < 0)
        goto cleanup;
    job->model = mi;
    job->api = API_NATIVE;
    ret = 0;
cleanup:
    if (ret >= 0) job->session_open = 1;
    collected_free(&c);
    return ret;
}

int attnd_parse_session_step(const attnd_parse_env *env, int model, const char *id,
                             const char *body, size_t len, attnd_job *job, attnd_error *e) {
    if (parse_native(env, env->models[model].name, BODY_STEP, body, len, job, e) < 0) return -1;
    if (!(job->session_id = strdup(id))) {
        attnd_job_free(job);
        return attnd_set_error(e, AERR_INTERNAL, "out of memory");
    }
    return 0;
}

int attnd_job_check_step(const attnd_job *job, const attnd_model_info *m, attnd_error *e) {
    const char *extra = !job->self                        ? "key"
                        : job->kpm                        ? "key_padding_mask"
                        : job->mask_bool || job->mask_add ? "attn_mask"
                        : job->positions                  ? "positions"
                                                          : NULL;
    if (extra) return session_extra(extra, e);
    if (job->B != 1)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "query: a session holds one sequence; send L x %d rows, not a "
                               "batch of %d",
                               m->hp.embed_dim, job->B);
    return 0;
}

/* ---- Open Inference Protocol ---- */

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

/* Little-endian INT32 or INT64 elements (positions) as the floats the
 * checks read; past 2^24 they round, which the position limit refuses
 * anyway. Frees raw; NULL when out of memory. */
static float *ints_as_floats(void *raw, uint64_t n, int is_i64) {
    float *f = malloc(n ? (size_t)n * sizeof(float) : 1);
    for (uint64_t k = 0; f && k < n; k++) {
        int64_t v64;
        int32_t v32;
        if (is_i64)
            memcpy(&v64, (char *)raw + k * 8, 8);
        else
            memcpy(&v32, (char *)raw + k * 4, 4);
        f[k] = is_i64 ? (float)v64 : (float)v32;
    }
    free(raw);
    return f;
}

/* The bytes of a binary input (need of them, for n elements), checked
 * like JSON data: floats finite, booleans 0 or 1. */
static int take_binary(v2_input *in, int idx, uint64_t n, uint64_t need, int is_bool, v2_bin *bin,
                       attnd_error *e) {
    int is_i32 = strcmp(in->datatype, "INT32") == 0, is_i64 = strcmp(in->datatype, "INT64") == 0;
    if (!is_bool && !is_i32 && !is_i64 && strcmp(in->datatype, "FP32") != 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): binary data must be FP32 or BOOL (positions: "
                               "INT32 or INT64), not %s",
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
    t->f = is_i32 || is_i64 ? ints_as_floats(buf, n, is_i64) : buf;
    if (!t->f) return attnd_set_error(e, AERR_INTERNAL, "out of memory reading %s", in->name);
    return attnd_tensor_check_finite(t, in->name, 0, e);
}

/* The role an input's name gives it (T_*), or -1 with e set: an unknown
 * name, or a role given twice. */
static int role_of(const v2_input *in, int idx, const collected *c, attnd_error *e) {
    int ti = -1;
    for (int i = 0; i < T_COUNT; i++)
        if (strcmp(in->name, TNAME[i]) == 0) ti = i;
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
    if (in->have_data && in->data.is_bool != *is_bool)
        return attnd_set_error(e, AERR_BAD_REQUEST, "inputs[%d] (%s).data: expected %s for %s", idx,
                               in->name, *is_bool ? "booleans" : "numbers", dt);
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
    snprintf(labels[ti], 48, "inputs[%d] (%s)", idx, TNAME[ti]);
    size_t esz = is_bool ? 1 : strcmp(in->datatype, "INT64") == 0 ? 8 : 4; /* binary data */
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
    TIMEOUT_FIELD("timeout_ms", V2(c.timeout_ms)),
    {.name = "attention_heads", .type = JF_CUSTOM, .read = attnd_sel_read_v2_heads,
     .offset = V2(c.sel), .accepts = 1u << JT_STRING | 1u << JT_NUMBER,
     .expects = "a string of head indices such as \"0,3,5\""},
    {.name = "attention_rows", .type = JF_CUSTOM, .read = attnd_sel_read_v2_rows,
     .offset = V2(c.sel), .accepts = 1u << JT_STRING, .expects = "a string \"start:end\""},
    {.name = "attention_top_k", .type = JF_SIZE, .offset = V2(c.sel.top_k),
     .max = ATTND_SEL_MAX},
    {.name = "attention_datatype", .type = JF_WORD, .offset = V2(c.sel.dtype),
     .words = &attnd_attention_datatypes},
};
static const jtable V2_PARAMETERS = JTABLE("parameter", V2_PARAMETER_FIELDS, 1);

static const jfield V2_FIELDS[] = {
    {.name = "id", .type = JF_STRDUP, .offset = V2(id)},
    {.name = "inputs", .type = JF_LIST, .each = read_v2_input}, /* query checked after */
    {.name = "outputs", .type = JF_LIST, .each = read_v2_output},
    {.name = "parameters", .type = JF_OBJECT, .table = &V2_PARAMETERS},
};
// clang-format on
/* Unknown top-level fields and parameters are skipped: the protocol allows
 * extensions. */
static const jtable V2 = JTABLE("field", V2_FIELDS, 1);

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

int attnd_parse_v2(const attnd_parse_env *env, const char *path_model, const char *body, size_t len,
                   size_t json_len, attnd_job *job, attnd_error *e) {
    v2_body v;
    memset(&v, 0, sizeof(v));
    collected_init(&v.c, 1);
    memset(job, 0, sizeof(*job));
    int ret = -1;
    if (json_len > len) {
        attnd_set_error(
            e, AERR_BAD_REQUEST,
            "Inference-Header-Content-Length %zu is more than the %zu bytes of the body", json_len,
            len);
        goto cleanup;
    }
    if (json_len) { /* binary data extension: JSON, then the tensors' bytes */
        v.bin.p = (const unsigned char *)body + json_len;
        v.bin.left = len - json_len;
        len = json_len;
    }
    if (read_body(body, len, &V2, &v, NULL, e) < 0) goto cleanup;
    if (!v.c.given[T_QUERY]) {
        attnd_set_error(e, AERR_BAD_REQUEST, "inputs: an input named 'query' is required");
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
    if (build_job(env, path_model, &v.c, kind, job, e) < 0) goto cleanup;
    job->api = API_V2;
    job->v2_outputs = v.out_bits;
    job->v2_binary = v.bin_all ? V2_OUT_ALL : v.bin_bits;
    job->v2_id = v.id;
    v.id = NULL;
    job->session_open = v.session_open;
    if (v.session_id[0] && !(job->session_id = strdup(v.session_id))) {
        attnd_job_free(job);
        attnd_set_error(e, AERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    ret = 0;
cleanup:
    attnd_tensor_free(&v.in.data);
    free(v.id);
    collected_free(&v.c);
    return ret;
}
