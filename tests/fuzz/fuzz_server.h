/* fuzz_server.h - what the request-parser fuzz targets share: two small
 * models (one self-attention, one cross-attention with kdim != vdim != E)
 * loaded into a model table as the daemon loads them (embedded default
 * weights), limits the fuzzer can reach, and the checks every accepted job
 * must pass:
 * sizes inside the limits, every buffer the job says it has, an attention
 * selection inside the model and the request, and an answer written back
 * from it that Jansson reads as JSON with the right shapes.
 * A refusal must carry a status and a sentence. A broken check aborts,
 * which libFuzzer reports as a finding.
 */
#ifndef ATTND_FUZZ_SERVER_H
#define ATTND_FUZZ_SERVER_H

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/base/buffer.h"
#include "../../server/body/request.h"
#include "../../server/body/v2.h"
#include "../test_models.h"
#include "fuzz_check.h"

/* "small" (slot 0) and "cross" (slot 1): E, H, kdim, vdim, bias, causal. */
static const char *const FUZZ_NAMES[2] = {"small", "cross"};
static const attn_hparams FUZZ_HP[2] = {
    {4, 2, 4, 4, 1, 0},
    {4, 2, 3, 2, 1, 1},
};
enum { FUZZ_MAX_TOKENS = 4096, FUZZ_MAX_ATTENTION_FLOATS = 1 << 16 };

/* What the readers check bodies against, with the first n_models (1 or 2)
 * of the fuzz models served: each table loaded at its first use, kept to
 * the end of the process. */
static const attnd_parse_env *fuzz_env(int n_models) {
    static attnd_parse_env env[2];
    attnd_parse_env *e = &env[n_models - 1];
    if (e->models) return e;
    char err[512];
    e->models = attnd_models_new(0);
    FUZZ_CHECK(e->models != NULL);
    for (int i = 0; i < n_models; i++) {
        attnd_model_config mc = test_model_entry(FUZZ_NAMES[i], &FUZZ_HP[i], NULL);
        attnd_version *v = test_models_add(e->models, &mc, err, sizeof err);
        if (!v) fprintf(stderr, "%s\n", err);
        FUZZ_CHECK(v != NULL && v->slot == i);
        attnd_version_unref(v); /* the table holds it */
    }
    e->max_tokens_per_request = FUZZ_MAX_TOKENS;
    e->max_attention_floats = FUZZ_MAX_ATTENTION_FLOATS;
    return e;
}

/* A refusal: a known kind and a non-empty sentence. */
static void fuzz_check_refusal(const attnd_error *e, const attnd_job *job) {
    FUZZ_CHECK(attnd_kind_is_error(e->code) && e->code < ATTND_KINDS);
    FUZZ_CHECK(e->msg[0] != '\0');
    FUZZ_CHECK(memchr(e->msg, '\0', sizeof(e->msg)) != NULL);
    FUZZ_CHECK(job->query == NULL && job->key == NULL && job->kpm == NULL);
    FUZZ_CHECK(job->ver == NULL); /* no reference kept on a model version */
}

/* The element count of the rank-r JSON array a, or -1 when ragged. */
static long long fuzz_json_count(const json_t *a, int depth) {
    if (!json_is_array(a)) return depth == 0 ? 1 : -1;
    long long n = 0, each = -2;
    for (size_t i = 0; i < json_array_size(a); i++) {
        long long k = fuzz_json_count(json_array_get(a, i), depth - 1);
        if (k < 0 || (each != -2 && k != each)) return -1;
        each = k;
        n += k;
    }
    return n;
}

/* An accepted job's attention selection: only with attention asked for;
 * heads distinct and of the model; rows within the query; top-k within
 * the keys (a session step's once admitted: its S is known then). */
static void fuzz_check_select(const attnd_job *job, int H) {
    const attnd_attn_select *s = &job->sel;
    if (job->weights == ATTN_WEIGHTS_NONE)
        FUZZ_CHECK(!s->heads && !s->row1 && !s->top_k && s->dtype == ATTND_ELEM_F32);
    FUZZ_CHECK(!s->heads || (s->n_heads >= 1 && s->n_heads <= H));
    for (int a = 0; s->heads && a < s->n_heads; a++) {
        FUZZ_CHECK(s->heads[a] >= 0 && s->heads[a] < H);
        for (int c = 0; c < a; c++)
            FUZZ_CHECK(s->heads[c] != s->heads[a]);
    }
    FUZZ_CHECK((s->row0 == 0 && s->row1 == 0) ||
               (s->row0 >= 0 && s->row0 < s->row1 && s->row1 <= job->L));
    FUZZ_CHECK(s->top_k >= 0 && (s->top_k <= job->S || job->session_id));
    FUZZ_CHECK(s->dtype == ATTND_ELEM_F32 || s->dtype == ATTND_ELEM_F16 ||
               s->dtype == ATTND_ELEM_BF16);
}

/* The outputs a v2 answer of job holds (floats: its attention floats). */
static size_t fuzz_v2_outputs(const attnd_job *job, uint64_t floats) {
    int all = !job->v2_outputs, o = job->v2_outputs;
    size_t n = all || (o & V2_OUT_OUTPUT);
    if (floats && !job->sel.top_k) n += 1;
    if (floats && job->sel.top_k)
        n += all ? 2 : !!(o & V2_OUT_TOPK_INDICES) + !!(o & V2_OUT_TOPK_VALUES);
    return n;
}

/* An accepted job: limits, buffers, and the answer written back. */
static void fuzz_check_job(const attnd_job *job) {
    FUZZ_CHECK(job->ver != NULL && job->model == job->ver->slot);
    FUZZ_CHECK(job->model >= 0 && job->model < 2);
    const attnd_model_info *m = &job->ver->info;
    FUZZ_CHECK(strcmp(m->name, FUZZ_NAMES[job->model]) == 0);
    FUZZ_CHECK(job->B >= 1 && job->L >= 1 && job->S >= 1);
    FUZZ_CHECK(attnd_job_tokens(job) <= FUZZ_MAX_TOKENS);
    fuzz_check_select(job, m->hp.num_heads);
    uint64_t floats = attnd_job_attention_floats(job, m->hp.num_heads);
    FUZZ_CHECK(floats <= (uint64_t)FUZZ_MAX_ATTENTION_FLOATS);
    FUZZ_CHECK(job->session_id || floats <= attnd_attention_floats(job->B, job->L, job->S,
                                                                   job->weights, m->hp.num_heads));
    FUZZ_CHECK(job->query != NULL);
    FUZZ_CHECK(job->self ? job->key == NULL && job->value == NULL : job->key != NULL);
    FUZZ_CHECK(!(job->mask_bool && job->mask_add));
    size_t nq = (size_t)job->B * job->L * m->hp.embed_dim;
    volatile float sink = 0;
    for (size_t i = 0; i < nq; i++) /* every element is there (ASan) and finite */
        FUZZ_CHECK(job->query[i] == job->query[i] && job->query[i] - job->query[i] == 0);
    if (job->key) sink += job->key[(size_t)job->B * job->S * m->hp.kdim - 1];
    if (job->value) sink += job->value[(size_t)job->B * job->S * m->hp.vdim - 1];
    if (job->kpm) FUZZ_CHECK(job->kpm[(size_t)job->B * job->S - 1] <= 1);
    size_t nmask = (size_t)(job->mask_per_seq ? job->B : 1) * job->L * job->S;
    if (job->mask_bool) FUZZ_CHECK(job->mask_bool[nmask - 1] <= 1);
    if (job->mask_add) sink += job->mask_add[nmask - 1];
    (void)sink;

    /* the answer, from zeros: valid JSON, output of B·L·E numbers */
    attnd_job w = *job;
    float *out = calloc(nq, sizeof(float));
    w.attn = floats ? calloc(floats, sizeof(float)) : NULL;
    w.attn_idx = floats && job->sel.top_k ? calloc(floats, sizeof(int32_t)) : NULL;
    FUZZ_CHECK(out && (!floats || w.attn) && (!floats || !job->sel.top_k || w.attn_idx));
    attnd_usage u = {.batch_requests = 1, .queue_us = 2, .compute_us = 3};
    size_t json_len = 0;
    attnd_sbuf b;
    attnd_sb_init(&b);
    FUZZ_CHECK(attnd_write_answer(&b, &w, m, out, &u, &json_len) == 0);
    json_error_t err;
    json_t *doc = json_loadb(b.p, json_len ? json_len : b.len, 0, &err);
    if (!doc) fprintf(stderr, "answer is not JSON (%s): %.300s\n", err.text, b.p);
    FUZZ_CHECK(doc != NULL);
    if (job->api == API_NATIVE) {
        json_t *o = json_object_get(doc, "output"), *a = json_object_get(doc, "attention");
        if (job->enc == ENC_JSON)
            FUZZ_CHECK(fuzz_json_count(o, job->rank3 ? 3 : 2) == (long long)nq);
        else
            FUZZ_CHECK(json_is_string(json_object_get(o, "b64")));
        FUZZ_CHECK((a != NULL) == (floats > 0));
        if (a && job->sel.top_k) /* {"indices": ..., "values": ...} */
            FUZZ_CHECK(json_object_size(a) == 2 && json_object_get(a, "indices") &&
                       json_object_get(a, "values"));
    } else { /* the outputs listed (all when none were), attention only when computed */
        json_t *outs = json_object_get(doc, "outputs");
        FUZZ_CHECK(json_is_array(outs) && json_array_size(outs) == fuzz_v2_outputs(job, floats));
        FUZZ_CHECK(!(job->v2_outputs && !(job->v2_outputs & ~V2_OUT_OUTPUT)) || floats == 0);
    }
    json_decref(doc);
    attnd_sb_free(&b);
    free(out);
    free(w.attn);
    free(w.attn_idx);
}

#endif
