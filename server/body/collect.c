/* collect.c - the road both body readers share (collect.h), from the
 * tensors and fields a native or v2 body gave to one checked attnd_job:
 * the model, the query, key and value, the masks and positions, the
 * attention selection, the limits, in the order the refusals are given;
 * and reading a body that must be one JSON object. Where the contract is
 * silent (docs/api.md repeats it): key_padding_mask is booleans only (a
 * tokenizer's attention_mask means the opposite); key_padding_mask (S) and
 * attn_mask (L,S) apply to every sequence of a batch, (B,S) and (B,L,S)
 * give one per sequence; value without key is refused, key without value
 * means value = key.
 */
#include "collect.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/sizes.h"

const char *const attnd_role_names[T_COUNT] = {"query",     "key",      "value", "key_padding_mask",
                                               "attn_mask", "positions"};

void attnd_collected_init(collected *c, int v2) {
    memset(c, 0, sizeof(*c));
    c->causal = -1;
    c->weights = -1;
    for (int i = 0; i < T_COUNT; i++)
        c->label[i] = attnd_role_names[i];
    c->causal_label = "causal";
    attnd_sel_in_init(&c->sel, v2);
}

void attnd_collected_free(collected *c) {
    for (int i = 0; i < T_COUNT; i++)
        attnd_tensor_free(&c->t[i]);
    attnd_sel_in_free(&c->sel);
}

/* Picks the model from the path and the body: its version serving now,
 * or the one the caller pinned (a session's). */
attnd_version *attnd_resolve_model(const attnd_parse_env *env, const char *path_model,
                                   const collected *c, attnd_error *e) {
    char names[160];
    const char *name = path_model ? path_model : c->have_model ? c->model : NULL;
    if (path_model && c->have_model && strcmp(c->model, path_model) != 0) {
        attnd_set_error(e, AERR_BAD_REQUEST, "model: '%s' does not match '%s' in the path",
                        c->model, path_model);
        return NULL;
    }
    if (c->pin) {
        if (name && strcmp(name, c->pin->name) != 0) {
            attnd_set_error(e, AERR_BAD_REQUEST, "model: '%.64s' is not the session's, '%s'", name,
                            c->pin->name);
            return NULL;
        }
        attnd_version_ref(c->pin);
        return c->pin;
    }
    if (name) return attnd_models_get(env->models, name, e);
    attnd_version *one = attnd_models_sole(env->models);
    if (one) return one;
    if (attnd_models_serving(env->models, NULL, 0) == 0)
        attnd_set_error(e, AERR_NOT_FOUND,
                        "no model is loaded (POST /v2/repository/index lists "
                        "what the server knows)");
    else
        attnd_set_error(e, AERR_BAD_REQUEST,
                        "model: required when more than one model is loaded (loaded: %s)",
                        attnd_models_names(env->models, names, sizeof(names)));
    return NULL;
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

/* ---- attnd_build_job's steps: each checks one part of what the body holds
 * against the model, in the order the refusals are given, and notes what
 * it learnt in job (its dimensions before its buffers) ---- */

/* How a message names dimension d of a role's tensor: "<label>.shape[d]"
 * when the body gave the shape apart from the data, else the first of the
 * nested arrays that dimension counts ("query[0]" for a row of an L×E
 * query, "key[0]" for the rows of a B×S×kdim key, "key" for its batch). */
static void dim_name(char *buf, size_t cap, const collected *c, int role, int d) {
    const attnd_tensor *t = &c->t[role];
    int n = snprintf(buf, cap, t->shaped ? "%s.shape[%d]" : "%s", c->label[role], d);
    for (int k = 0; !t->shaped && k < d && n >= 0 && (size_t)n < cap; k++)
        n += snprintf(buf + n, cap - (size_t)n, "[0]");
}

/* The 400 for rows of a role that are not the model's width `want`
 * (`dim`, as the model names it): "query[0]: 3 numbers, model 'm' has embed_dim 512",
 * "inputs[0] (query).shape[1]: rows of 3 numbers, ...". */
static int wrong_width(const collected *c, int role, const char *dim, int want,
                       const attnd_model_info *m, attnd_error *e) {
    const attnd_tensor *t = &c->t[role];
    char at[200];
    dim_name(at, sizeof at, c, role, t->rank - 1);
    int got = t->shape[t->rank - 1];
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s: %s%d number%s, model '%s' has %s %d", at,
                           t->shaped ? "rows of " : "", got, got == 1 ? "" : "s", m->name, dim,
                           want);
}

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
        return wrong_width(c, T_QUERY, "embed_dim", m->hp.embed_dim, m, e);
    return 0;
}

/* One role, key or value, when given: the query's rank and batch, `rows`
 * rows when rows > 0 (a value has the key's), each of `width` numbers (the
 * model's `dim`). */
static int check_role(const collected *c, int role, const attnd_job *job, int rows, int width,
                      const char *dim, const attnd_model_info *m, attnd_error *e) {
    const attnd_tensor *t = &c->t[role];
    int qrank = c->t[T_QUERY].rank;
    char at[200];
    if (t->rank != qrank)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: has %d dimensions where query has %d",
                               c->label[role], t->rank, qrank);
    if (job->rank3 && t->shape[0] != job->B) {
        dim_name(at, sizeof at, c, role, 0);
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: batch of %d where query has %d", at,
                               t->shape[0], job->B);
    }
    if (rows > 0 && t->shape[t->rank - 2] != rows) {
        dim_name(at, sizeof at, c, role, t->rank - 2);
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: %d rows where key has %d", at,
                               t->shape[t->rank - 2], rows);
    }
    if (t->shape[t->rank - 1] != width) return wrong_width(c, role, dim, width, m, e);
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

/* What a session's rows (an open's prefix, a step) may not carry, refused
 * before any shape is checked, so that no message names a shape a session
 * would then refuse anyway; and causal false (a session is always causal). */
static int check_session_body(const collected *c, const attnd_model_info *m, attnd_error *e) {
    if (attnd_model_sessions_refusal(m, e) < 0) return -1;
    static const int extras[] = {T_KEY, T_VALUE, T_KPM, T_MASK, T_POS};
    for (size_t i = 0; i < countof(extras); i++)
        if (c->given[extras[i]]) return attnd_session_extra(c->label[extras[i]], e);
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
int attnd_build_job(const attnd_parse_env *env, const char *path_model, collected *c,
                    body_kind kind, attnd_job *job, attnd_error *e) {
    memset(job, 0, sizeof(*job));
    attnd_version *v = attnd_resolve_model(env, path_model, c, e);
    if (!v) return -1;
    const attnd_model_info *m = &v->info;
    job->model = v->slot;
    job->ver = v; /* held from here: attnd_job_free lets it go */
    if (kind != BODY_WHOLE && check_session_body(c, m, e) < 0) {
        attnd_job_free(job);
        return -1;
    }
    job->causal = c->causal < 0 ? m->hp.causal : c->causal;
    job->weights = c->weights;
    job->enc = c->enc;
    job->timeout_ms = c->timeout_ms;
    if (check_query(c, m, job, e) < 0 || check_key_value(c, m, job, e) < 0 ||
        check_masks(c, m, job, e) < 0 ||
        attnd_sel_check(&c->sel, m, job, kind == BODY_STEP, e) < 0 ||
        check_limits(env, job, e) < 0 || move_tensors(c, job, e) < 0) {
        if (job->ver) { /* move_tensors frees the whole job when it fails */
            free(job->sel.heads);
            attnd_version_unref(job->ver);
            memset(job, 0, sizeof(*job));
        }
        return -1;
    }
    return 0;
}

/* "timeout_ms" (v2: parameters.timeout_ms): the request's own deadline, a
 * whole number of milliseconds, 1 or more; past INT_MAX it is INT_MAX (the
 * smaller of it and server.request_timeout_ms holds anyway). */
int attnd_read_timeout(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
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
int attnd_read_body(const char *body, size_t len, const jtable *t, void *dst, unsigned *given,
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
