/* job.h - what a client asked for, as plain C: one attnd_job, whichever
 * API the body came in (the readers: request.c for native bodies, v2.c for
 * the Open Inference Protocol), with what it counts (tokens, attention
 * floats) and the checks every API shares on the models and on a
 * session's rows (job.c). The bottom of body/: it reads no body and knows
 * no HTTP and no threads.
 */
#ifndef ATTND_JOB_H
#define ATTND_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "../../config/config.h"
#include "../../config/enums.h"
#include "../../core/attn.h"
#include "../base/reply.h"
#include "../codec/half.h"
#include "../models/registry.h"
#include "../models/version.h"

typedef struct {
    attnd_models *models;           /* the models served and their versions; borrowed */
    int max_tokens_per_request;     /* B*(L+S) above it -> 413 */
    long long max_attention_floats; /* the attention answer's floats above it -> 413:
                                       attnd_job_attention_floats */
    /* The version session id was opened on, referenced, or NULL (no such
     * session): how a v2 step or close finds its session's version, which
     * may no longer be the one serving (a reload of another shape, an
     * unload). NULL: no sessions to ask. */
    attnd_version *(*session_version)(void *arg, const char *id);
    void *session_arg;
} attnd_parse_env;

typedef enum { API_NATIVE = 0, API_V2 = 1 } attnd_api;
typedef enum { ENC_JSON = 0, ENC_BASE64 = 1 } attnd_encoding;

/* The words of "attention" (attn_weights_mode: none, mean, heads) and of
 * "encoding" (attnd_encoding: json, base64), as the field tables read them
 * (the selection's words are selection.h's). */
extern const attnd_enum attnd_attention_modes;
extern const attnd_enum attnd_encodings;

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
    int model;          /* its model's slot (registry.h): the queue it joins */
    attnd_version *ver; /* the version it computes on, held from the moment its model was
                           named: a reload after that does not change it */
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
    int session_close;         /* 1: close the session once this step is answered (v2
                                  parameters.session_close); with no query, close it now */
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

/* 0 when model m can hold KV-cache sessions, else -1 with the one 400
 * that says why not: its kdim or vdim differ from embed_dim (a session's
 * rows are their own keys and values). */
int attnd_model_sessions_refusal(const attnd_model_info *m, attnd_error *e);

/* What a session step may carry, checked once the session is known (for
 * every API): rows of one sequence, no key, no masks, no positions.
 * Returns 0, or -1 with the 400 naming what is extra. */
int attnd_job_check_step(const attnd_job *job, const attnd_model_info *m, attnd_error *e);

/* The refusal of a session's rows that carry more than query rows: field
 * named, and what a session takes instead. Returns -1. */
int attnd_session_extra(const char *field, attnd_error *e);

void attnd_job_free(attnd_job *job); /* zeroed and NULL jobs are fine */
/* Frees the inputs (query, key, value) of a job whose answer is written;
 * attnd_job_free frees the rest later. */
void attnd_job_drop_inputs(attnd_job *job);

#endif
