/* fuzz_server.h - what the request-parser fuzz targets share: two small
 * models (one self-attention, one cross-attention with kdim != vdim != E),
 * limits the fuzzer can reach, and the checks every accepted job must pass:
 * sizes inside the limits, every buffer the job says it has, and an answer
 * written back from it that Jansson reads as JSON with the right shapes.
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
#include "fuzz_check.h"

static const attnd_model_info FUZZ_MODELS[2] = {
    {"small", {4, 2, 4, 4, 1, 0}},
    {"cross", {4, 2, 3, 2, 1, 1}},
};

static const attnd_parse_env FUZZ_ENV = {FUZZ_MODELS, 2, 4096, 1 << 16};

/* A refusal: a known kind and a non-empty sentence. */
static void fuzz_check_refusal(const attnd_error *e, const attnd_job *job) {
    FUZZ_CHECK(attnd_kind_is_error(e->code) && e->code < ATTND_KINDS);
    FUZZ_CHECK(e->msg[0] != '\0');
    FUZZ_CHECK(memchr(e->msg, '\0', sizeof(e->msg)) != NULL);
    FUZZ_CHECK(job->query == NULL && job->key == NULL && job->kpm == NULL);
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

/* An accepted job: limits, buffers, and the answer written back. */
static void fuzz_check_job(const attnd_job *job) {
    const attnd_model_info *m = &FUZZ_MODELS[job->model];
    FUZZ_CHECK(job->model >= 0 && job->model < 2);
    FUZZ_CHECK(job->B >= 1 && job->L >= 1 && job->S >= 1);
    FUZZ_CHECK(attnd_job_tokens(job) <= FUZZ_ENV.max_tokens_per_request);
    uint64_t floats = attnd_attention_floats(job->B, job->L, job->S, job->weights, m->hp.num_heads);
    FUZZ_CHECK(floats <= (uint64_t)FUZZ_ENV.max_attention_floats);
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
    FUZZ_CHECK(out && (!floats || w.attn));
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
        json_t *o = json_object_get(doc, "output");
        if (job->enc == ENC_JSON)
            FUZZ_CHECK(fuzz_json_count(o, job->rank3 ? 3 : 2) == (long long)nq);
        else
            FUZZ_CHECK(json_is_string(json_object_get(o, "b64")));
    } else { /* the outputs listed (all when none were), attention only when computed */
        json_t *outs = json_object_get(doc, "outputs");
        size_t want = (!job->v2_outputs || (job->v2_outputs & 1)) + (floats > 0);
        FUZZ_CHECK(json_is_array(outs) && json_array_size(outs) == want);
        FUZZ_CHECK(!(job->v2_outputs && !(job->v2_outputs & 2)) || floats == 0);
    }
    json_decref(doc);
    attnd_sb_free(&b);
    free(out);
    free(w.attn);
}

#endif
