/* job.c - the job every body reader fills (job.h): what it counts
 * (tokens, attention floats) against the limits, freeing it, the served
 * models by name, and the checks every API shares on a session's rows.
 */
#include "job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/sizes.h"

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
    uint64_t n = attnd_job_attention_floats(job, job->ver->info.hp.num_heads);
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
    attnd_version_unref(job->ver);
    memset(job, 0, sizeof(*job));
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
int attnd_session_extra(const char *field, attnd_error *e) {
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "%s: a session step takes query rows only: no key, value, "
                           "key_padding_mask, attn_mask or positions (it is causal over the "
                           "cache, its rows at the positions after it)",
                           field);
}

int attnd_job_check_step(const attnd_job *job, const attnd_model_info *m, attnd_error *e) {
    const char *extra = !job->self                        ? "key"
                        : job->kpm                        ? "key_padding_mask"
                        : job->mask_bool || job->mask_add ? "attn_mask"
                        : job->positions                  ? "positions"
                                                          : NULL;
    if (extra) return attnd_session_extra(extra, e);
    if (job->B != 1)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "query: a session holds one sequence; send L x %d rows, not a "
                               "batch of %d",
                               m->hp.embed_dim, job->B);
    return 0;
}
