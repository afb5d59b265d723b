/* request.h - what a client asked for, as plain C: the native body
 * (POST /v1/attention) and the Open Inference Protocol body (POST
 * /v2/models/{name}/infer) are both read into one attnd_job, checked once
 * against the model and the limits, and later written back by the same
 * writers on the worker threads (answer.c). No HTTP and no threads in here.
 */
#ifndef ATTND_REQUEST_H
#define ATTND_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "../../config/config.h"
#include "../../config/enums.h"
#include "../../core/attn.h"
#include "../base/buffer.h"
#include "../base/reply.h"
#include "../codec/half.h"

/* What the parsers need to know about one served model. */
typedef struct {
    const char *name;        /* borrowed from the config */
    attn_hparams hp;         /* E, H, kdim, vdim, bias, causal default, decoder options */
    int max_positions;       /* rotary positions must stay below it; 0 = 2^24 */
    const char *fingerprint; /* its weights' fingerprint as loaded (session state files,
                                session/state.h), borrowed; NULL when not computed */
    /* what computes, settled at load (attn_model_pack): */
    attn_precision precision; /* BF16, or FP32 (a bf16 model too on a CPU without bf16 kernels) */
    int kv16;                 /* 1: a session's cache is bf16 pages (attn_model.attn16) */
    size_t bytes;             /* the model's memory (attn_model_bytes) */
} attnd_model_info;

typedef struct {
    const attnd_model_info *models; /* (n_models), borrowed */
    int n_models;
    int max_tokens_per_request;     /* B*(L+S) above it -> 413 */
    long long max_attention_floats; /* the attention answer's floats above it -> 413:
                                       attnd_job_attention_floats */
} attnd_parse_env;

/* The index of the served model called name, or -1 with e set to the 404
 * every route gives: "unknown model 'x' (loaded: a, b)". */
int attnd_find_model(const attnd_parse_env *env, const char *name, attnd_error *e);

typedef enum { API_NATIVE = 0, API_V2 = 1 } attnd_api;
typedef enum { ENC_JSON = 0, ENC_BASE64 = 1 } attnd_encoding;

/* The words of "attention" (attn_weights_mode: none, mean, heads) and of
 * "encoding" (attnd_encoding: json, base64), as the field tables read them;
 * "attention_dtype" (float32, float16, bfloat16) and v2's
 * "attention_datatype" (FP32, FP16, BF16) into attnd_elem. */
extern const attnd_enum attnd_attention_modes;
extern const attnd_enum attnd_encodings;
extern const attnd_enum attnd_attention_dtypes;
extern const attnd_enum attnd_attention_datatypes;

/* The part of the attention matrices a request asks for (SPEC section 9;
 * the core's attn_select). Zeroed: all of them, in float32. */
typedef struct {
    int *heads;       /* (n_heads) distinct heads, in the order given; owned; NULL: every head */
    int n_heads;      /* with heads: 1..H */
    int row0, row1;   /* query rows [row0, row1); both 0: every row */
    int top_k;        /* 1..S: each answer row's k largest weights and their keys; 0: whole rows */
    attnd_elem dtype; /* F32, F16 or BF16: the weights rounded to it, base64 and binary in it */
} attnd_attn_select;

/* One admitted request: B sequences of one model, all of query length L and
 * key length S. Buffers are owned and freed by attnd_job_free. */
typedef struct {
    int model; /* index into the served models */
    attnd_api api;
    int B, L, S;               /* sequences, query length, key length (S == L for self) */
    int rank3;                 /* 1: query came as B×L×E and answers keep the leading B */
    int self;                  /* 1: no key given: key = value = query */
    float *query;              /* (B*L, E) */
    float *key;                /* (B*S, Kd) or NULL when self */
    float *value;              /* (B*S, Vd) or NULL: value = key */
    uint8_t *kpm;              /* key_padding_mask (B, S), 1 = hidden, or NULL */
    uint8_t *mask_bool;        /* attn_mask (L,S) or (B,L,S) booleans, 1 = hidden, or NULL */
    float *mask_add;           /* attn_mask (L,S) or (B,L,S) floats, added, or NULL */
    int mask_per_seq;          /* 1: the mask is (B,L,S); 0: one (L,S) for every sequence */
    int32_t *positions;        /* (B, L) rotary positions, or NULL: 0..L-1 */
    int causal;                /* 1: hide key j > query i */
    attn_weights_mode weights; /* none, mean or heads */
    attnd_attn_select sel;     /* which part of the matrices (weights != none) */
    attnd_encoding enc;        /* how the answer carries tensors */
    char *v2_id;               /* the v2 "id" to echo, or NULL */
    char *session_id;          /* a step of this session (v2 parameters.session_id, or the
                                  native step's path), or NULL */
    int session_open;          /* 1: open a session (v2 parameters.session_open, or POST
                                  /v1/sessions), its prefix the query when there is one */
    int v2_binary;             /* binary data extension for outputs: V2_OUT_* bits */
    int v2_outputs;            /* outputs listed in the request: V2_OUT_* bits; 0 = all */
    int timeout_ms;            /* the body's own deadline (native timeout_ms, v2
                                  parameters.timeout_ms), ms >= 1; 0 = not given */
    /* results, written by the worker */
    float *attn;       /* (B,H,L,S) heads or (B,L,S) mean, or the selection's part (sel), owned,
                          or NULL */
    int32_t *attn_idx; /* with sel.top_k: the key of each weight in attn (its shape), owned */
} attnd_job;

/* The outputs of a v2 answer, as bits of attnd_job.v2_outputs and .v2_binary. */
enum {
    V2_OUT_OUTPUT = 1,
    V2_OUT_ATTENTION = 2,
    V2_OUT_TOPK_INDICES = 4,
    V2_OUT_TOPK_VALUES = 8,
    V2_OUT_ALL = 15
};

/* Query plus key tokens: what the token limits count. */
long long attnd_job_tokens(const attnd_job *job);

/* Floats of the attention matrices B sequences of L×S ask for: B·L·S, times
 * H for ATTN_WEIGHTS_HEADS, 0 for none; UINT64_MAX when that passes 64 bits
 * (only a request not yet admitted can). The one formula the parser's
 * limit, the batcher's buffers and the answer writers share. */
uint64_t attnd_attention_floats(int B, int L, int S, attn_weights_mode mode, int H);
/* The same for job's answer and a model of H heads: its selection's part
 * (selected heads, rows, and top_k or S per row) of its B sequences. With
 * top-k it counts the values; the indices are as many again. */
uint64_t attnd_job_attention_floats(const attnd_job *job, int H);
/* The one check of limits.max_attention_floats: 0 when job's attention
 * answer (its model, B, L, S, weights and selection set) fits, else -1
 * with e set (413). A session step's sentence names the rows and the
 * cached tokens (session = 1). */
int attnd_attention_limit(const attnd_parse_env *env, const attnd_job *job, int session,
                          attnd_error *e);
/* job's attention_top_k against its S keys: 0, or -1 with the 400 naming
 * the value. The parsers check it, but a session step's S is known at its
 * admission (attnd_admit checks it then). */
int attnd_check_top_k(const attnd_job *job, attnd_error *e);

/* Reads a native body. path_model is the {name} of
 * /v1/models/{name}/attention or NULL. Returns 0, or -1 with e set
 * (400, 404, 413, 500); job holds nothing to free after a failure. */
int attnd_parse_native(const attnd_parse_env *env, const char *path_model, const char *body,
                       size_t len, attnd_job *job, attnd_error *e);

/* Reads the body of POST /v1/sessions: a native body whose query, the
 * session's prefix, may be left out (an empty body gives nothing).
 * job->session_open is set. Returns 1 when it holds a query: job is then
 * as attnd_parse_native makes it. Returns 0 when it does not: only "model"
 * may be given then, and job holds nothing but job->model. Returns -1 with
 * e set (400, 404, 413, 500); job holds nothing to free after a failure. */
int attnd_parse_session_open(const attnd_parse_env *env, const char *body, size_t len,
                             attnd_job *job, attnd_error *e);

/* Reads the body of POST /v1/sessions/{id}/attention: a native body for
 * the session's model (the index the session table holds), job->session_id
 * set to id. Same returns as attnd_parse_native. */
int attnd_parse_session_step(const attnd_parse_env *env, int model, const char *id,
                             const char *body, size_t len, attnd_job *job, attnd_error *e);

/* 0 when model m can hold KV-cache sessions, else -1 with the one 400
 * that says why not: its kdim or vdim differ from embed_dim (a session's
 * rows are their own keys and values). */
int attnd_model_sessions_refusal(const attnd_model_info *m, attnd_error *e);

/* What a session step may carry, checked once the session is known (for
 * every API): rows of one sequence, no key, no masks, no positions.
 * Returns 0, or -1 with the 400 naming what is extra. */
int attnd_job_check_step(const attnd_job *job, const attnd_model_info *m, attnd_error *e);

/* Reads an Open Inference Protocol infer body for the model path_model.
 * json_len is the Inference-Header-Content-Length of the binary data
 * extension (the JSON part; the inputs' bytes follow it), 0 when the whole
 * body is JSON. */
int attnd_parse_v2(const attnd_parse_env *env, const char *path_model, const char *body, size_t len,
                   size_t json_len, attnd_job *job, attnd_error *e);

void attnd_job_free(attnd_job *job); /* zeroed and NULL jobs are fine */
/* Frees the inputs (query, key, value) of a job whose answer is written;
 * attnd_job_free frees the rest later. */
void attnd_job_drop_inputs(attnd_job *job);

/* The 400 of a result that is not finite: the input's magnitudes did it
 * (a client error, not the server's). */
#define ATTND_MSG_OVERFLOW                                                                         \
    "query, key, value or attn_mask: values too large, the result overflows float32"

/* How the answer was produced, for "usage" and "parameters", and the
 * session fields of a session step's answer. */
typedef struct {
    int batch_requests;  /* requests in the compute batch this one shared */
    uint64_t queue_us;   /* admission to compute start */
    uint64_t compute_us; /* attn_forward of the batch */
    const char *session; /* a session step's id: "session" and "cached_tokens" come first in
                            the answer (v2: "session_id" and "cached_tokens", first in its
                            parameters); NULL for other requests. Borrowed */
    int cached_tokens;   /* the session's tokens after the step (with session) */
} attnd_usage;

/* Writes the 200 body for job (native or v2 as job->api says) from out
 * (B*L, E) and job->attn, whole, on the calling thread (answer.c, which
 * also writes answers over the compute pool: answer.h). *json_len is set
 * to the length of the JSON part when binary outputs follow it
 * (Inference-Header-Content-Length), else 0. Returns 0, or -1 when out of
 * memory. */
int attnd_write_answer(attnd_sbuf *b, const attnd_job *job, const attnd_model_info *model,
                       const float *out, const attnd_usage *u, size_t *json_len);

#endif
