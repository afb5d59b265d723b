/* request.c - native and Open Inference Protocol bodies into attnd_job, and
 * attnd_job results back into bodies. See request.h.
 *
 * Choices where the contract is silent (docs/api.md repeats them):
 * - unknown fields of a native body are refused (a typo like "atention"
 *   must not silently return no attention); a v2 body's unknown top-level
 *   fields and parameters are ignored, as the protocol allows extensions;
 * - key_padding_mask is booleans only (0/1 numbers are refused: a
 *   tokenizer's attention_mask means the opposite);
 * - key_padding_mask (S) and attn_mask (L,S) apply to every sequence of a
 *   batched query; (B,S) and (B,L,S) give one per sequence;
 * - value without key is refused; key without value means value = key.
 */
#include "request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/sizes.h"
#include "jsonin.h"
#include "tensor.h"

/* The tensors a body may carry, by role. */
enum { T_QUERY, T_KEY, T_VALUE, T_KPM, T_MASK, T_COUNT };
static const char *const TNAME[T_COUNT] = {"query", "key", "value", "key_padding_mask",
                                           "attn_mask"};

/* What both parsers collect before the common checks. */
typedef struct {
    tensor t[T_COUNT];
    int given[T_COUNT];
    const char *label[T_COUNT]; /* how messages name the tensor */
    char model[ATTND_NAME_MAX + 8];
    int have_model;
    int causal; /* -1: the model's default */
    attn_weights_mode weights;
    attnd_encoding enc;
} collected;

static void collected_free(collected *c) {
    for (int i = 0; i < T_COUNT; i++)
        tensor_free(&c->t[i]);
}

long long attnd_job_tokens(const attnd_job *job) {
    return (long long)job->B * ((long long)job->L + job->S);
}

int attnd_attention_floats(int B, int L, int S, attn_weights_mode mode, int H, uint64_t limit,
                           uint64_t *n) {
    uint64_t r;
    if (sz_mul((uint64_t)B, (uint64_t)L, limit, &r) < 0 || sz_mul(r, (uint64_t)S, limit, &r) < 0 ||
        sz_mul(r, mode == ATTN_WEIGHTS_HEADS ? (uint64_t)H : 1, limit, &r) < 0) {
        *n = r;
        return -1;
    }
    *n = mode == ATTN_WEIGHTS_NONE ? 0 : r;
    return 0;
}

void attnd_job_free(attnd_job *job) {
    if (!job) return;
    free(job->query);
    free(job->key);
    free(job->value);
    free(job->kpm);
    free(job->mask_bool);
    free(job->mask_add);
    free(job->v2_id);
    free(job->attn);
    memset(job, 0, sizeof(*job));
}

static int find_model(const attnd_parse_env *env, const char *name) {
    for (int i = 0; i < env->n_models; i++)
        if (strcmp(env->models[i].name, name) == 0) return i;
    return -1;
}

/* Picks the model from the path and the body. */
static int resolve_model(const attnd_parse_env *env, const char *path_model, const collected *c,
                         attnd_error *e) {
    if (path_model) {
        int m = find_model(env, path_model);
        if (m < 0) return attnd_set_error(e, AERR_NOT_FOUND, "unknown model '%s'", path_model);
        if (c->have_model && strcmp(c->model, path_model) != 0)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "model: '%s' does not match '%s' in the path", c->model,
                                   path_model);
        return m;
    }
    if (c->have_model) {
        int m = find_model(env, c->model);
        if (m < 0) return attnd_set_error(e, AERR_NOT_FOUND, "unknown model '%s'", c->model);
        return m;
    }
    if (env->n_models == 1) return 0;
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "model: required when more than one model is loaded");
}

static float *take_f(tensor *t) {
    float *f = t->f;
    t->f = NULL;
    return f;
}

static uint8_t *take_u(tensor *t) {
    uint8_t *u = t->u;
    t->u = NULL;
    return u;
}

/* The checks both APIs share: shapes against the model, masks against the
 * lengths, then the limits. Moves the tensors into job. */
static int build_job(const attnd_parse_env *env, const char *path_model, collected *c,
                     attnd_job *job, attnd_error *e) {
    int mi = resolve_model(env, path_model, c, e);
    if (mi < 0) return -1;
    const attnd_model_info *m = &env->models[mi];
    const attn_hparams *hp = &m->hp;
    tensor *q = &c->t[T_QUERY], *k = &c->t[T_KEY], *v = &c->t[T_VALUE];
    tensor *kpm = &c->t[T_KPM], *am = &c->t[T_MASK];
    const char *const *lb = c->label;

    if (!c->given[T_QUERY]) return attnd_set_error(e, AERR_BAD_REQUEST, "query: required");
    if (q->rank != 2 && q->rank != 3)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected L×E or B×L×E, got %d dimension%s",
                               lb[T_QUERY], q->rank, q->rank == 1 ? "" : "s");
    int r3 = q->rank == 3;
    int B = r3 ? q->shape[0] : 1, L = q->shape[q->rank - 2];
    if (q->shape[q->rank - 1] != hp->embed_dim)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: rows have %d numbers, model '%s' has embed_dim %d", lb[T_QUERY],
                               q->shape[q->rank - 1], m->name, hp->embed_dim);
    int S = L;
    if (c->given[T_VALUE] && !c->given[T_KEY])
        return attnd_set_error(e, AERR_BAD_REQUEST, "value: given without key");
    if (c->given[T_KEY]) {
        if (k->rank != q->rank)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: has %d dimensions where query has %d",
                                   lb[T_KEY], k->rank, q->rank);
        if (r3 && k->shape[0] != B)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: batch of %d where query has %d",
                                   lb[T_KEY], k->shape[0], B);
        if (k->shape[k->rank - 1] != hp->kdim)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "%s: rows have %d numbers, model '%s' has kdim %d", lb[T_KEY],
                                   k->shape[k->rank - 1], m->name, hp->kdim);
        S = k->shape[k->rank - 2];
    } else if (hp->kdim != hp->embed_dim || hp->vdim != hp->embed_dim) {
        return attnd_set_error(
            e, AERR_BAD_REQUEST,
            "key: required, model '%s' has kdim %d and vdim %d, not embed_dim %d", m->name,
            hp->kdim, hp->vdim, hp->embed_dim);
    }
    if (c->given[T_VALUE]) {
        if (v->rank != q->rank)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: has %d dimensions where query has %d",
                                   lb[T_VALUE], v->rank, q->rank);
        if (r3 && v->shape[0] != B)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: batch of %d where query has %d",
                                   lb[T_VALUE], v->shape[0], B);
        if (v->shape[v->rank - 2] != S)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: %d rows where key has %d", lb[T_VALUE],
                                   v->shape[v->rank - 2], S);
        if (v->shape[v->rank - 1] != hp->vdim)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "%s: rows have %d numbers, model '%s' has vdim %d", lb[T_VALUE],
                                   v->shape[v->rank - 1], m->name, hp->vdim);
    } else if (c->given[T_KEY] && hp->vdim != hp->kdim) {
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "value: required, model '%s' has vdim %d, not kdim %d", m->name,
                               hp->vdim, hp->kdim);
    }
    if (c->given[T_KPM]) {
        if (!kpm->is_bool)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected booleans (true = hidden)",
                                   lb[T_KPM]);
        int ok = (kpm->rank == 1 && kpm->shape[0] == S) ||
                 (kpm->rank == 2 && kpm->shape[0] == B && kpm->shape[1] == S);
        if (!ok)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "%s: expected %d booleans (S) or %d×%d (B×S)", lb[T_KPM], S, B,
                                   S);
    }
    int mask_per_seq = 0;
    if (c->given[T_MASK]) {
        int ok2 = am->rank == 2 && am->shape[0] == L && am->shape[1] == S;
        int ok3 = am->rank == 3 && am->shape[0] == B && am->shape[1] == L && am->shape[2] == S;
        if (!ok2 && !ok3)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected %d×%d (L×S) or %d×%d×%d",
                                   lb[T_MASK], L, S, B, L, S);
        mask_per_seq = ok3;
    }
    /* B, L, S < 2^31: B·(L+S) < 2^63 cannot wrap, but goes through the one helper */
    uint64_t tokens, floats;
    sz_add((uint64_t)L, (uint64_t)S, UINT64_MAX, &tokens);
    sz_mul((uint64_t)B, tokens, UINT64_MAX, &tokens);
    if (tokens > (uint64_t)env->max_tokens_per_request)
        return attnd_set_error(e, AERR_TOO_LARGE,
                               "request has %llu query and key tokens, the limit is %d",
                               (unsigned long long)tokens, env->max_tokens_per_request);
    int wrapped = attnd_attention_floats(B, L, S, c->weights, hp->num_heads, UINT64_MAX, &floats);
    if (wrapped < 0 || floats > (uint64_t)env->max_attention_floats)
        return attnd_set_error(e, AERR_TOO_LARGE,
                               "attention matrix of %s%llu floats, the limit is %lld",
                               wrapped < 0 ? "more than " : "", (unsigned long long)floats,
                               env->max_attention_floats);

    memset(job, 0, sizeof(*job));
    job->model = mi;
    job->B = B;
    job->L = L;
    job->S = S;
    job->rank3 = r3;
    job->self = !c->given[T_KEY];
    job->causal = c->causal < 0 ? hp->causal : c->causal;
    job->weights = c->weights;
    job->enc = c->enc;
    job->mask_per_seq = mask_per_seq;
    job->query = take_f(q);
    if (c->given[T_KEY]) job->key = take_f(k);
    if (c->given[T_VALUE]) job->value = take_f(v);
    if (c->given[T_KPM]) {
        if (kpm->rank == 1 && B > 1) { /* one mask for every sequence */
            job->kpm = malloc((size_t)B * (size_t)S);
            if (!job->kpm) {
                attnd_job_free(job);
                return attnd_set_error(e, AERR_INTERNAL, "out of memory");
            }
            for (int b = 0; b < B; b++)
                memcpy(job->kpm + (size_t)b * S, kpm->u, (size_t)S);
        } else {
            job->kpm = take_u(kpm);
        }
    }
    if (c->given[T_MASK]) {
        if (am->is_bool)
            job->mask_bool = take_u(am);
        else
            job->mask_add = take_f(am);
    }
    return 0;
}

/* Reads "field": "<one of words>" into *out (index of the word). */
static int read_word(jin *j, const char *field, const char *const *words, int n, int *out,
                     attnd_error *e) {
    char buf[32];
    int cut = 0;
    if (jin_peek(j) != '"' || jin_string_buf(j, buf, sizeof(buf), &cut) < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected a string, got %s", field,
                               jin_kind(j));
    for (int i = 0; i < n && !cut; i++)
        if (strcmp(buf, words[i]) == 0) {
            *out = i;
            return 0;
        }
    char list[128] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s\"%s\"", i ? ", " : "",
                 words[i]);
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected one of %s", field, list);
}

static const char *const WEIGHT_WORDS[] = {"none", "mean", "heads"};
static const char *const ENC_WORDS[] = {"json", "base64"};

static int read_causal(jin *j, const char *field, int *causal, attnd_error *e) {
    if (jin_peek(j) == 'n') {
        if (jin_null(j) < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        *causal = -1;
        return 0;
    }
    int b;
    if (jin_bool(j, &b) < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected true or false, got %s", field,
                               jin_kind(j));
    *causal = b;
    return 0;
}

/* Starts reading a body that must be one JSON object: returns 1 when it is
 * "{}" (read whole), 0 when j stands at its first key, or -1 with e set. */
static int body_object_open(jin *j, const char *body, size_t len, attnd_error *e) {
    jin_init(j, body, len);
    if (jin_peek(j) != '{') {
        if (jin_peek(j) == -1) return attnd_set_error(e, AERR_BAD_REQUEST, "body is empty");
        if (jin_skip(j) < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        return attnd_set_error(e, AERR_BAD_REQUEST, "body must be a JSON object");
    }
    j->p++;
    if (jin_peek(j) == '}') {
        j->p++;
        return 1;
    }
    return 0;
}

static int read_model_name(jin *j, const char *field, collected *c, attnd_error *e) {
    int cut = 0;
    if (jin_peek(j) != '"' || jin_string_buf(j, c->model, sizeof(c->model), &cut) < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected a string, got %s", field,
                               jin_kind(j));
    if (cut) return attnd_set_error(e, AERR_NOT_FOUND, "unknown model (name too long)");
    c->have_model = 1;
    return 0;
}

int attnd_parse_native(const attnd_parse_env *env, const char *path_model, const char *body,
                       size_t len, attnd_job *job, attnd_error *e) {
    collected c;
    memset(&c, 0, sizeof(c));
    memset(job, 0, sizeof(*job));
    c.causal = -1;
    for (int i = 0; i < T_COUNT; i++)
        c.label[i] = TNAME[i];
    int seen_causal = 0, seen_weights = 0, seen_enc = 0;
    int ret = -1;
    jin j;
    int empty = body_object_open(&j, body, len, e);
    if (empty < 0) goto cleanup;
    if (!empty) {
        for (;;) {
            char key[40];
            int cut = 0;
            if (jin_string_buf(&j, key, sizeof(key), &cut) < 0 || jin_expect(&j, ':') < 0) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
                goto cleanup;
            }
            int ti = -1;
            for (int i = 0; i < T_COUNT && !cut; i++)
                if (strcmp(key, TNAME[i]) == 0) ti = i;
            if (ti >= 0) {
                if (c.given[ti]) {
                    attnd_set_error(e, AERR_BAD_REQUEST, "%s: given twice", key);
                    goto cleanup;
                }
                tensor_kind kind = ti == T_KPM ? TK_BOOL : ti == T_MASK ? TK_ANY : TK_FLOAT;
                int max_rank = ti == T_KPM ? 2 : 3;
                if (tensor_read(&j, TNAME[ti], kind, max_rank, ti == T_MASK, &c.t[ti], e) < 0)
                    goto cleanup;
                c.given[ti] = 1;
            } else if (!cut && strcmp(key, "model") == 0) {
                if (c.have_model) {
                    attnd_set_error(e, AERR_BAD_REQUEST, "model: given twice");
                    goto cleanup;
                }
                if (jin_peek(&j) == 'n') {
                    if (jin_null(&j) < 0) {
                        attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
                        goto cleanup;
                    }
                } else if (read_model_name(&j, "model", &c, e) < 0) {
                    goto cleanup;
                }
            } else if (!cut && strcmp(key, "causal") == 0) {
                if (seen_causal++ || read_causal(&j, "causal", &c.causal, e) < 0) {
                    if (seen_causal > 1)
                        attnd_set_error(e, AERR_BAD_REQUEST, "causal: given twice");
                    goto cleanup;
                }
            } else if (!cut && strcmp(key, "attention") == 0) {
                int w = 0;
                if (seen_weights++ || read_word(&j, "attention", WEIGHT_WORDS, 3, &w, e) < 0) {
                    if (seen_weights > 1)
                        attnd_set_error(e, AERR_BAD_REQUEST, "attention: given twice");
                    goto cleanup;
                }
                c.weights = (attn_weights_mode)w;
            } else if (!cut && strcmp(key, "encoding") == 0) {
                int w = 0;
                if (seen_enc++ || read_word(&j, "encoding", ENC_WORDS, 2, &w, e) < 0) {
                    if (seen_enc > 1) attnd_set_error(e, AERR_BAD_REQUEST, "encoding: given twice");
                    goto cleanup;
                }
                c.enc = (attnd_encoding)w;
            } else {
                attnd_set_error(e, AERR_BAD_REQUEST,
                                "%s%s: unknown field (model, query, key, value, causal, "
                                "key_padding_mask, attn_mask, attention, encoding)",
                                key, cut ? "..." : "");
                goto cleanup;
            }
            int r = jin_next(&j, '}');
            if (r < 0) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
                goto cleanup;
            }
            if (r == 1) break;
        }
    }
    if (jin_end(&j) < 0) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
        goto cleanup;
    }
    if (build_job(env, path_model, &c, job, e) < 0) goto cleanup;
    job->api = API_NATIVE;
    ret = 0;
cleanup:
    collected_free(&c);
    return ret;
}

/* ---- Open Inference Protocol ---- */

/* One element of "inputs". */
typedef struct {
    char name[40];
    char datatype[16];
    int have_shape, rank;
    int64_t shape[TENSOR_MAX_RANK + 1]; /* each 0..TENSOR_MAX_DIM */
    tensor data;
    int have_data;
    long long bin_size; /* parameters.binary_data_size, or -1: data in the JSON */
} v2_input;

/* The binary part of a body (binary data extension): inputs take their
 * bytes from it in order. */
typedef struct {
    const unsigned char *p; /* next unread byte */
    size_t left;            /* bytes not yet taken */
} v2_bin;

/* An input's "parameters": binary_data_size is read, the rest ignored. */
static int read_input_parameters(jin *j, int idx, v2_input *in, attnd_error *e) {
    if (jin_peek(j) != '{')
        return attnd_set_error(e, AERR_BAD_REQUEST, "inputs[%d].parameters: expected an object",
                               idx);
    j->p++;
    if (jin_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[32];
        int cut = 0;
        if (jin_string_buf(j, key, sizeof(key), &cut) < 0 || jin_expect(j, ':') < 0)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (!cut && strcmp(key, "binary_data_size") == 0) {
            double d;
            if (jin_peek(j) == '[' || jin_number(j, &d) < 0 || d != floor(d) || d < 0 || d > 1e15)
                return attnd_set_error(e, AERR_BAD_REQUEST,
                                       "inputs[%d].parameters.binary_data_size: expected a size",
                                       idx);
            in->bin_size = (long long)d;
        } else if (jin_skip(j) < 0) {
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        }
        int r = jin_next(j, '}');
        if (r < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (r == 1) return 0;
    }
}

static int read_v2_input(jin *j, int idx, v2_input *in, attnd_error *e) {
    char field[96];
    memset(in, 0, sizeof(*in));
    in->bin_size = -1;
    if (jin_peek(j) != '{')
        return attnd_set_error(e, AERR_BAD_REQUEST, "inputs[%d]: expected an object, got %s", idx,
                               jin_kind(j));
    j->p++;
    if (jin_peek(j) == '}') {
        j->p++;
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d]: needs name, shape, datatype and data", idx);
    }
    for (;;) {
        char key[32];
        int cut = 0;
        if (jin_string_buf(j, key, sizeof(key), &cut) < 0 || jin_expect(j, ':') < 0)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (!cut && strcmp(key, "name") == 0) {
            if (jin_peek(j) != '"' || jin_string_buf(j, in->name, sizeof(in->name), &cut) < 0)
                return attnd_set_error(e, AERR_BAD_REQUEST, "inputs[%d].name: expected a string",
                                       idx);
        } else if (!cut && strcmp(key, "datatype") == 0) {
            if (jin_peek(j) != '"' ||
                jin_string_buf(j, in->datatype, sizeof(in->datatype), &cut) < 0)
                return attnd_set_error(e, AERR_BAD_REQUEST,
                                       "inputs[%d].datatype: expected a string", idx);
        } else if (!cut && strcmp(key, "shape") == 0) {
            if (jin_expect(j, '[') < 0)
                return attnd_set_error(e, AERR_BAD_REQUEST,
                                       "inputs[%d].shape: expected an array of sizes", idx);
            in->rank = 0;
            if (jin_peek(j) == ']') {
                j->p++;
            } else {
                for (;;) {
                    double d;
                    if (in->rank > TENSOR_MAX_RANK)
                        return attnd_set_error(e, AERR_BAD_REQUEST,
                                               "inputs[%d].shape: too many dimensions", idx);
                    if (jin_peek(j) == '[' || jin_number(j, &d) < 0 || d != floor(d) || d < 0)
                        return attnd_set_error(e, AERR_BAD_REQUEST,
                                               "inputs[%d].shape[%d]: expected a size", idx,
                                               in->rank);
                    if (d > TENSOR_MAX_DIM)
                        return attnd_set_error(e, AERR_TOO_LARGE,
                                               "inputs[%d].shape[%d]: %.0f is too large (at most "
                                               "%d)",
                                               idx, in->rank, d, TENSOR_MAX_DIM);
                    in->shape[in->rank++] = (int64_t)d;
                    int r = jin_next(j, ']');
                    if (r < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
                    if (r == 1) break;
                }
            }
            in->have_shape = 1;
        } else if (!cut && strcmp(key, "data") == 0) {
            if (in->name[0])
                snprintf(field, sizeof(field), "inputs[%d] (%s).data", idx, in->name);
            else
                snprintf(field, sizeof(field), "inputs[%d].data", idx);
            tensor_free(&in->data);
            if (tensor_read(j, field, TK_ANY, TENSOR_MAX_RANK, 0, &in->data, e) < 0) return -1;
            in->have_data = 1;
        } else if (!cut && strcmp(key, "parameters") == 0) {
            if (read_input_parameters(j, idx, in, e) < 0) return -1;
        } else {
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "inputs[%d].%s: unknown key (name, shape, datatype, data, "
                                   "parameters)",
                                   idx, key);
        }
        int r = jin_next(j, '}');
        if (r < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (r == 1) break;
    }
    if (in->have_data && in->bin_size >= 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d]: both data and parameters.binary_data_size", idx);
    if (!in->name[0] || !in->have_shape || !in->datatype[0] || (!in->have_data && in->bin_size < 0))
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d]: needs name, shape, datatype and data", idx);
    return 0;
}

/* Checks one input against its declared shape and datatype and files it
 * under its role. */
/* The bytes of a binary input, checked like JSON data (finite floats). */
static int take_binary(v2_input *in, int idx, uint64_t n, int is_bool, v2_bin *bin,
                       attnd_error *e) {
    size_t esz = is_bool ? 1 : sizeof(float);
    uint64_t need;
    sz_mul(n, esz, UINT64_MAX, &need); /* n <= TENSOR_MAX_ELEMS: cannot wrap */
    if (!is_bool && strcmp(in->datatype, "FP32") != 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): binary data must be FP32 or BOOL, not %s", idx,
                               in->name, in->datatype);
    if ((uint64_t)in->bin_size != need)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): binary_data_size %lld where shape and datatype "
                               "need %llu",
                               idx, in->name, in->bin_size, (unsigned long long)need);
    if ((size_t)in->bin_size > bin->left)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): binary_data_size %lld, but %zu bytes of binary "
                               "data are left",
                               idx, in->name, in->bin_size, bin->left);
    tensor *t = &in->data;
    memset(t, 0, sizeof(*t));
    void *buf = malloc(in->bin_size ? (size_t)in->bin_size : 1);
    if (!buf) return attnd_set_error(e, AERR_INTERNAL, "out of memory reading %s", in->name);
    memcpy(buf, bin->p, (size_t)in->bin_size);
    bin->p += in->bin_size;
    bin->left -= (size_t)in->bin_size;
    t->n = (size_t)n;
    t->is_bool = is_bool;
    if (is_bool) {
        t->u = buf;
        for (uint64_t k = 0; k < n; k++)
            t->u[k] = t->u[k] != 0;
        return 0;
    }
    t->f = buf;
    for (uint64_t k = 0; k < n; k++) {
        if (isfinite(t->f[k])) continue;
        int shape[TENSOR_MAX_RANK];
        for (int d = 0; d < in->rank; d++)
            shape[d] = (int)in->shape[d];
        char at[128];
        tensor_index_name(at, sizeof(at), in->name, in->rank, shape, (size_t)k);
        float bad = t->f[k];
        tensor_free(t);
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: %s is not allowed", at,
                               isnan(bad) ? "NaN" : "infinity");
    }
    return 0;
}

static int file_v2_input(v2_input *in, int idx, collected *c, char labels[][48], v2_bin *bin,
                         attnd_error *e) {
    int ti = -1;
    for (int i = 0; i < T_COUNT; i++)
        if (strcmp(in->name, TNAME[i]) == 0) ti = i;
    if (ti < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d].name: unknown input '%s' (query, key, value, "
                               "key_padding_mask, attn_mask)",
                               idx, in->name);
    if (c->given[ti])
        return attnd_set_error(e, AERR_BAD_REQUEST, "inputs[%d]: input '%s' given twice", idx,
                               in->name);
    int is_float = strcmp(in->datatype, "FP32") == 0 || strcmp(in->datatype, "FP64") == 0 ||
                   strcmp(in->datatype, "FP16") == 0;
    int is_bool = strcmp(in->datatype, "BOOL") == 0;
    int want_float = ti <= T_VALUE, want_bool = ti == T_KPM;
    if ((!is_float && !is_bool) || (want_float && !is_float) || (want_bool && !is_bool))
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d].datatype: '%s' cannot carry %s (%s)", idx, in->datatype,
                               in->name,
                               want_float  ? "FP32"
                               : want_bool ? "BOOL"
                                           : "BOOL or FP32");
    if (in->have_data && in->data.is_bool != is_bool)
        return attnd_set_error(e, AERR_BAD_REQUEST, "inputs[%d] (%s).data: expected %s for %s", idx,
                               in->name, is_bool ? "booleans" : "numbers", in->datatype);
    if (in->rank < 1 || in->rank > 3)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s).shape: takes 1 to 3 dimensions, got %d", idx,
                               in->name, in->rank);
    for (int d = 0; d < in->rank; d++)
        if (in->shape[d] < 1)
            return attnd_set_error(e, AERR_BAD_REQUEST,
                                   "inputs[%d] (%s).shape[%d]: must be positive", idx, in->name, d);
    uint64_t n;
    if (sz_prod(in->shape, in->rank, TENSOR_MAX_ELEMS, &n) < 0)
        return attnd_set_error(e, AERR_TOO_LARGE,
                               "inputs[%d] (%s).shape: too large: more than %llu elements", idx,
                               in->name, (unsigned long long)TENSOR_MAX_ELEMS);
    if (in->bin_size >= 0 && take_binary(in, idx, n, is_bool, bin, e) < 0) return -1;
    if (n != in->data.n)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "inputs[%d] (%s): shape needs %llu values, data has %zu", idx,
                               in->name, (unsigned long long)n, in->data.n);
    tensor *t = &c->t[ti];
    *t = in->data;
    memset(&in->data, 0, sizeof(in->data));
    t->rank = in->rank;
    for (int d = 0; d < in->rank; d++)
        t->shape[d] = (int)in->shape[d];
    c->given[ti] = 1;
    snprintf(labels[ti], 48, "inputs[%d] (%s)", idx, TNAME[ti]);
    c->label[ti] = labels[ti];
    return 0;
}

/* "parameters": {"causal": bool, "attention": "none|mean|heads"}; other
 * keys are ignored. */
static int read_v2_parameters(jin *j, collected *c, int *weights_given, int *bin_all,
                              attnd_error *e) {
    if (jin_peek(j) != '{')
        return attnd_set_error(e, AERR_BAD_REQUEST, "parameters: expected an object, got %s",
                               jin_kind(j));
    j->p++;
    if (jin_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[32];
        int cut = 0;
        if (jin_string_buf(j, key, sizeof(key), &cut) < 0 || jin_expect(j, ':') < 0)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (!cut && strcmp(key, "causal") == 0) {
            if (read_causal(j, "parameters.causal", &c->causal, e) < 0) return -1;
        } else if (!cut && strcmp(key, "attention") == 0) {
            int w = 0;
            if (read_word(j, "parameters.attention", WEIGHT_WORDS, 3, &w, e) < 0) return -1;
            c->weights = (attn_weights_mode)w;
            *weights_given = 1;
        } else if (!cut && strcmp(key, "binary_data_output") == 0) {
            if (jin_bool(j, bin_all) < 0)
                return attnd_set_error(e, AERR_BAD_REQUEST,
                                       "parameters.binary_data_output: expected true or false");
        } else if (jin_skip(j) < 0) {
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        }
        int r = jin_next(j, '}');
        if (r < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (r == 1) return 0;
    }
}

/* {"binary_data": bool, ...} of one requested output. */
static int read_output_parameters(jin *j, int idx, int *binary, attnd_error *e) {
    if (jin_peek(j) != '{')
        return attnd_set_error(e, AERR_BAD_REQUEST, "outputs[%d].parameters: expected an object",
                               idx);
    j->p++;
    if (jin_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[32];
        int cut = 0;
        if (jin_string_buf(j, key, sizeof(key), &cut) < 0 || jin_expect(j, ':') < 0)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (!cut && strcmp(key, "binary_data") == 0) {
            if (jin_bool(j, binary) < 0)
                return attnd_set_error(e, AERR_BAD_REQUEST,
                                       "outputs[%d].parameters.binary_data: expected true or false",
                                       idx);
        } else if (jin_skip(j) < 0) {
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        }
        int r = jin_next(j, '}');
        if (r < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (r == 1) return 0;
    }
}

/* "outputs": [{"name": "output"|"attention", "parameters": {"binary_data": b}}]:
 * sets *want_attention and the binary bits (1 output, 2 attention). */
static int read_v2_outputs(jin *j, int *want_attention, int *bin_bits, attnd_error *e) {
    if (jin_expect(j, '[') < 0)
        return attnd_set_error(e, AERR_BAD_REQUEST, "outputs: expected an array");
    if (jin_peek(j) == ']') {
        j->p++;
        return 0;
    }
    for (int idx = 0;; idx++) {
        if (jin_expect(j, '{') < 0)
            return attnd_set_error(e, AERR_BAD_REQUEST, "outputs[%d]: expected an object", idx);
        if (jin_peek(j) == '}') {
            j->p++;
        } else {
            int is_attn = 0, binary = 0;
            for (;;) {
                char key[32], name[32];
                int cut = 0;
                if (jin_string_buf(j, key, sizeof(key), &cut) < 0 || jin_expect(j, ':') < 0)
                    return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
                if (!cut && strcmp(key, "name") == 0) {
                    if (jin_peek(j) != '"' || jin_string_buf(j, name, sizeof(name), &cut) < 0)
                        return attnd_set_error(e, AERR_BAD_REQUEST,
                                               "outputs[%d].name: expected a string", idx);
                    if (!cut && strcmp(name, "attention") == 0)
                        *want_attention = is_attn = 1;
                    else if (cut || strcmp(name, "output") != 0)
                        return attnd_set_error(e, AERR_BAD_REQUEST,
                                               "outputs[%d].name: unknown output '%s' (output, "
                                               "attention)",
                                               idx, name);
                } else if (!cut && strcmp(key, "parameters") == 0) {
                    if (read_output_parameters(j, idx, &binary, e) < 0) return -1;
                } else if (jin_skip(j) < 0) {
                    return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
                }
                int r = jin_next(j, '}');
                if (r < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
                if (r == 1) break;
            }
            if (binary) *bin_bits |= is_attn ? 2 : 1;
        }
        int r = jin_next(j, ']');
        if (r < 0) return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
        if (r == 1) return 0;
    }
}

int attnd_parse_v2(const attnd_parse_env *env, const char *path_model, const char *body, size_t len,
                   size_t json_len, attnd_job *job, attnd_error *e) {
    collected c;
    memset(&c, 0, sizeof(c));
    memset(job, 0, sizeof(*job));
    c.causal = -1;
    for (int i = 0; i < T_COUNT; i++)
        c.label[i] = TNAME[i];
    char labels[T_COUNT][48];
    char *id = NULL;
    v2_input in;
    memset(&in, 0, sizeof(in));
    int have_inputs = 0, want_attention = 0, weights_given = 0, bin_bits = 0, bin_all = 0;
    int ret = -1;
    v2_bin bin = {NULL, 0};
    if (json_len > len) {
        attnd_set_error(
            e, AERR_BAD_REQUEST,
            "Inference-Header-Content-Length %zu is more than the %zu bytes of the body", json_len,
            len);
        goto cleanup;
    }
    if (json_len) { /* binary data extension: JSON, then the tensors' bytes */
        bin.p = (const unsigned char *)body + json_len;
        bin.left = len - json_len;
        len = json_len;
    }
    jin j;
    int empty = body_object_open(&j, body, len, e);
    if (empty < 0) goto cleanup;
    if (!empty) {
        for (;;) {
            char key[32];
            int cut = 0;
            if (jin_string_buf(&j, key, sizeof(key), &cut) < 0 || jin_expect(&j, ':') < 0) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
                goto cleanup;
            }
            if (!cut && strcmp(key, "id") == 0) {
                free(id);
                id = NULL;
                if (jin_peek(&j) != '"' || jin_string(&j, &id, NULL) < 0) {
                    attnd_set_error(e, AERR_BAD_REQUEST, "id: expected a string, got %s",
                                    jin_kind(&j));
                    goto cleanup;
                }
            } else if (!cut && strcmp(key, "inputs") == 0) {
                if (have_inputs++) {
                    attnd_set_error(e, AERR_BAD_REQUEST, "inputs: given twice");
                    goto cleanup;
                }
                if (jin_peek(&j) != '[') {
                    attnd_set_error(e, AERR_BAD_REQUEST, "inputs: expected an array, got %s",
                                    jin_kind(&j));
                    goto cleanup;
                }
                j.p++;
                if (jin_peek(&j) == ']') {
                    j.p++;
                } else {
                    for (int idx = 0;; idx++) {
                        if (read_v2_input(&j, idx, &in, e) < 0 ||
                            file_v2_input(&in, idx, &c, labels, &bin, e) < 0)
                            goto cleanup;
                        tensor_free(&in.data);
                        int r = jin_next(&j, ']');
                        if (r < 0) {
                            attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
                            goto cleanup;
                        }
                        if (r == 1) break;
                    }
                }
            } else if (!cut && strcmp(key, "parameters") == 0) {
                if (read_v2_parameters(&j, &c, &weights_given, &bin_all, e) < 0) goto cleanup;
            } else if (!cut && strcmp(key, "outputs") == 0) {
                if (read_v2_outputs(&j, &want_attention, &bin_bits, e) < 0) goto cleanup;
            } else if (jin_skip(&j) < 0) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
                goto cleanup;
            }
            int r = jin_next(&j, '}');
            if (r < 0) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
                goto cleanup;
            }
            if (r == 1) break;
        }
    }
    if (jin_end(&j) < 0) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s", j.err);
        goto cleanup;
    }
    if (!c.given[T_QUERY]) {
        attnd_set_error(e, AERR_BAD_REQUEST, "inputs: an input named 'query' is required");
        goto cleanup;
    }
    if (bin.left) {
        attnd_set_error(e, AERR_BAD_REQUEST,
                        "%zu bytes of binary data after the inputs' binary_data_size", bin.left);
        goto cleanup;
    }
    if (want_attention && !weights_given) c.weights = ATTN_WEIGHTS_MEAN;
    if (build_job(env, path_model, &c, job, e) < 0) goto cleanup;
    job->api = API_V2;
    job->v2_binary = bin_all ? 3 : bin_bits;
    job->v2_id = id;
    id = NULL;
    ret = 0;
cleanup:
    tensor_free(&in.data);
    free(id);
    collected_free(&c);
    return ret;
}

/* ---- answers ---- */

static void put_shape(sbuf *b, int rank, const int *shape) {
    sb_putc(b, '[');
    for (int i = 0; i < rank; i++)
        sb_printf(b, "%s%d", i ? "," : "", shape[i]);
    sb_putc(b, ']');
}

/* A tensor in the native encoding the client chose. */
static void put_tensor(sbuf *b, const float *x, int rank, const int *shape, attnd_encoding enc) {
    if (enc == ENC_BASE64) {
        size_t n = 1;
        for (int i = 0; i < rank; i++)
            n *= (size_t)shape[i];
        sb_puts(b, "{\"shape\":");
        put_shape(b, rank, shape);
        sb_puts(b, ",\"dtype\":\"float32\",\"b64\":\"");
        sb_b64(b, x, n * sizeof(float));
        sb_puts(b, "\"}");
    } else {
        sb_tensor_json(b, x, rank, shape);
    }
}

/* Shapes of the answer tensors. Native answers keep the request's rank
 * ((L,E) or (B,L,E); attention (H,L,S) or (L,S), with a leading B for a
 * batch). v2 answers always have the ranks /v2/models/{name} declares:
 * output (B,L,E) and attention (B,H,L,S), H being 1 for "mean", whatever
 * the rank of the query (a (L,E) query is a batch of one). */
static int out_shape(const attnd_job *job, const attnd_model_info *m, int *shape) {
    int r = 0;
    if (job->rank3 || job->api == API_V2) shape[r++] = job->B;
    shape[r++] = job->L;
    shape[r++] = m->hp.embed_dim;
    return r;
}

static int attn_shape(const attnd_job *job, const attnd_model_info *m, int *shape) {
    int r = 0;
    int v2 = job->api == API_V2;
    if (job->rank3 || v2) shape[r++] = job->B;
    if (job->weights == ATTN_WEIGHTS_HEADS)
        shape[r++] = m->hp.num_heads;
    else if (v2)
        shape[r++] = 1;
    shape[r++] = job->L;
    shape[r++] = job->S;
    return r;
}

int attnd_write_answer(sbuf *b, const attnd_job *job, const attnd_model_info *m, const float *out,
                       const attnd_usage *u, size_t *json_len) {
    *json_len = 0;
    int oshape[3], ashape[4];
    int orank = out_shape(job, m, oshape);
    int arank = attn_shape(job, m, ashape);
    size_t nout = (size_t)job->B * job->L * m->hp.embed_dim;
    uint64_t nattn;
    attnd_attention_floats(job->B, job->L, job->S, job->weights, m->hp.num_heads, UINT64_MAX,
                           &nattn); /* admitted: within max_attention_floats */
    int want_attn = job->weights != ATTN_WEIGHTS_NONE && job->attn;
    size_t floats = nout + (want_attn ? nattn : 0);
    sb_reserve(b, 256 + floats * (job->enc == ENC_BASE64 && job->api == API_NATIVE ? 6 : 17));
    if (job->api == API_NATIVE) {
        sb_puts(b, "{\"model\":");
        sb_json_str(b, m->name);
        sb_puts(b, ",\"output\":");
        put_tensor(b, out, orank, oshape, job->enc);
        if (want_attn) {
            sb_puts(b, ",\"attention\":");
            put_tensor(b, job->attn, arank, ashape, job->enc);
        }
        sb_printf(b,
                  ",\"usage\":{\"batch\":%d,\"sequences\":%d,\"query_tokens\":%lld,"
                  "\"key_tokens\":%lld,\"queue_us\":%llu,\"compute_us\":%llu}}\n",
                  u->batch_requests, job->B, (long long)job->B * job->L, (long long)job->B * job->S,
                  (unsigned long long)u->queue_us, (unsigned long long)u->compute_us);
    } else {
        sb_puts(b, "{\"model_name\":");
        sb_json_str(b, m->name);
        sb_puts(b, ",\"model_version\":\"1\"");
        if (job->v2_id) {
            sb_puts(b, ",\"id\":");
            sb_json_str(b, job->v2_id);
        }
        sb_printf(b,
                  ",\"parameters\":{\"batch\":%d,\"queue_us\":%llu,\"compute_us\":%llu}"
                  ",\"outputs\":[{\"name\":\"output\",\"datatype\":\"FP32\",\"shape\":",
                  u->batch_requests, (unsigned long long)u->queue_us,
                  (unsigned long long)u->compute_us);
        put_shape(b, orank, oshape);
        int bin_out = job->v2_binary & 1, bin_attn = want_attn && (job->v2_binary & 2);
        if (bin_out) {
            sb_printf(b, ",\"parameters\":{\"binary_data_size\":%zu}}", nout * sizeof(float));
        } else {
            sb_puts(b, ",\"data\":[");
            sb_floats(b, out, nout);
            sb_puts(b, "]}");
        }
        if (want_attn) {
            sb_puts(b, ",{\"name\":\"attention\",\"datatype\":\"FP32\",\"shape\":");
            put_shape(b, arank, ashape);
            if (bin_attn) {
                sb_printf(b, ",\"parameters\":{\"binary_data_size\":%zu}}", nattn * sizeof(float));
            } else {
                sb_puts(b, ",\"data\":[");
                sb_floats(b, job->attn, nattn);
                sb_puts(b, "]}");
            }
        }
        if (bin_out || bin_attn) { /* binary data extension: the JSON, then the bytes */
            sb_puts(b, "]}");
            *json_len = b->len;
            if (bin_out) sb_put(b, out, nout * sizeof(float));
            if (bin_attn) sb_put(b, job->attn, nattn * sizeof(float));
        } else {
            sb_puts(b, "]}\n");
        }
    }
    return b->oom ? -1 : 0;
}
