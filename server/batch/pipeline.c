/* pipeline.c - pack, compute, answer: the one road of every batch
 * (pipeline.h).
 *
 * A batch runs in steps named for what they do, each spread over the whole
 * pool: pack the requests' rows without padding into one attn_batch (a
 * lone request's own buffers go in as they are), compute it with one
 * attn_forward, then check and answer each request (JSON, base64 or
 * binary: answer.c, which cuts a large answer into chunks for every
 * thread). Nothing goes through one thread.
 */
#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "../body/answer.h"
#include "../codec/tensor.h"

struct attnd_pipeline {
    attn_ctx *ctx; /* borrowed */
    int cap;       /* requests per batch at most */
    /* grow-only scratch, reused across batches */
    float *q, *k, *v, *out; /* packed query (T,E), key (U,Kd), value (U,Vd), output (T,E) */
    size_t qcap, kcap, vcap, outcap; /* floats */
    attn_seq *seqs;                  /* (B) */
    size_t seqcap;
    size_t *off;           /* (3 cap) per request: first query, key and output float */
    char *keep;            /* (cap) 1: request i's answer is left to write */
    attnd_answer *answers; /* (cap) the answers being written */
    int *who;              /* (cap) answers[a] is request who[a]'s */
};

attnd_pipeline *attnd_pipeline_new(attn_ctx *ctx, int max_requests) {
    attnd_pipeline *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ctx = ctx;
    p->cap = max_requests;
    p->off = calloc(3 * (size_t)max_requests, sizeof *p->off);
    p->keep = calloc((size_t)max_requests, sizeof *p->keep);
    p->answers = calloc((size_t)max_requests, sizeof *p->answers);
    p->who = calloc((size_t)max_requests, sizeof *p->who);
    if (!p->off || !p->keep || !p->answers || !p->who) {
        attnd_pipeline_free(p);
        return NULL;
    }
    return p;
}

void attnd_pipeline_free(attnd_pipeline *p) {
    if (!p) return;
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->out);
    free(p->seqs);
    free(p->off);
    free(p->keep);
    free(p->answers);
    free(p->who);
    free(p);
}

/* A batch on its way through the steps. */
typedef struct {
    attnd_pipeline *p;
    attnd_req **rs; /* (n) */
    int n;
    const attn_model *m;
    const attnd_model_info *info;
    attnd_metrics *mt; /* or NULL */
    attnd_answered_fn done;
    void *arg;
    attn_batch b;
    size_t T, U;      /* query and key tokens */
    int all_self;     /* 1: key == NULL for the core */
    int need_value;   /* 1: a packed value separate from the key */
    long long tokens; /* query + key tokens, for the metrics */
    int fail;         /* 1: no answer but err */
    char err[256];
    uint64_t t0, t1; /* compute */
} batch_run;

/* r is answered: its session step ended (kept when its answer is whole),
 * then handed back. */
static void answered(batch_run *br, attnd_req *r, int whole) {
    attnd_req_end_step(r, whole);
    br->done(br->arg, r);
}

/* r answered with the refusal e. */
static void refuse(batch_run *br, attnd_req *r, const attnd_error *e) {
    attnd_reply_error(&r->reply, e);
    answered(br, r, 0);
}

/* ---- step 1: pack ---- */

/* Room for n floats in the scratch array *a of *cap floats, doubling. */
static int grow_floats(float **a, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < n)
        c *= 2;
    float *q = realloc(*a, c * sizeof(float));
    if (!q) return -1;
    *a = q;
    *cap = c;
    return 0;
}

/* Sizes, kinds and each request's offsets into the packed buffers. */
static void measure(batch_run *br, size_t *off) {
    const attn_hparams *hp = &br->m->hp;
    size_t E = (size_t)hp->embed_dim, Kd = (size_t)hp->kdim, Vd = (size_t)hp->vdim;
    int any_value = 0, any_self = 0;
    br->all_self = 1;
    br->T = br->U = 0;
    br->tokens = 0;
    for (int i = 0; i < br->n; i++) {
        attnd_job *j = &br->rs[i]->job;
        off[3 * i] = br->T * E;      /* query and output */
        off[3 * i + 1] = br->U * Kd; /* key */
        off[3 * i + 2] = br->U * Vd; /* value */
        br->T += (size_t)j->B * j->L;
        br->U += (size_t)j->B * j->S;
        br->tokens += br->rs[i]->tokens;
        br->all_self &= j->self;
        any_self |= j->self;
        any_value |= j->value != NULL;
    }
    br->need_value = any_value || any_self;
}

/* Each request's attention buffer (and its top-k indices), when it asked
 * for one: what its answer holds, its selection's part. */
static int alloc_attention(batch_run *br) {
    for (int i = 0; i < br->n; i++) {
        attnd_job *j = &br->rs[i]->job;
        if (j->weights == ATTN_WEIGHTS_NONE) continue;
        uint64_t na = attnd_job_attention_floats(j, br->m->hp.num_heads); /* admitted: it fits */
        free(j->attn);
        free(j->attn_idx);
        j->attn_idx = NULL;
        j->attn = malloc(na ? na * sizeof(float) : 1);
        if (!j->attn) return -1;
        if (j->sel.top_k && !(j->attn_idx = malloc(na * sizeof(int32_t)))) return -1;
    }
    return 0;
}

/* The packed buffers of this batch, grown as needed. */
static int reserve(attnd_pipeline *p, const batch_run *br) {
    const attn_hparams *hp = &br->m->hp;
    size_t B = 0;
    for (int i = 0; i < br->n; i++)
        B += (size_t)br->rs[i]->job.B;
    if (B > p->seqcap) {
        attn_seq *sq = realloc(p->seqs, B * sizeof(attn_seq));
        if (!sq) return -1;
        p->seqs = sq;
        p->seqcap = B;
    }
    if (grow_floats(&p->out, &p->outcap, br->T * (size_t)hp->embed_dim) < 0) return -1;
    if (br->n == 1) return 0; /* the request's own buffers go in as they are */
    if (grow_floats(&p->q, &p->qcap, br->T * (size_t)hp->embed_dim) < 0) return -1;
    if (br->all_self) return 0;
    if (grow_floats(&p->k, &p->kcap, br->U * (size_t)hp->kdim) < 0) return -1;
    if (br->need_value && grow_floats(&p->v, &p->vcap, br->U * (size_t)hp->vdim) < 0) return -1;
    return 0;
}

/* One request's inputs into the packed buffers (a pool task). */
static void pack_task(void *arg, int i, int thread) {
    (void)thread;
    batch_run *br = arg;
    attnd_pipeline *p = br->p;
    const attn_hparams *hp = &br->m->hp;
    const attnd_job *j = &br->rs[i]->job;
    const size_t *off = p->off + 3 * (size_t)i;
    size_t rows_q = (size_t)j->B * j->L, rows_k = (size_t)j->B * j->S;
    memcpy(p->q + off[0], j->query, rows_q * hp->embed_dim * sizeof(float));
    if (br->all_self) return;
    const float *k = j->self ? j->query : j->key;
    const float *v = j->self ? j->query : j->value ? j->value : j->key;
    memcpy(p->k + off[1], k, rows_k * hp->kdim * sizeof(float));
    if (br->need_value) memcpy(p->v + off[2], v, rows_k * hp->vdim * sizeof(float));
}

/* The core's view of sequence bb of request r: lengths, masks, where its
 * weights go (its selection's part), and a session step's cache (bf16
 * pages when the model's attention is bf16). */
static void describe(attn_seq *q, const attnd_req *r, int bb, const attn_model *m) {
    int H = m->hp.num_heads;
    const attnd_job *j = &r->job;
    size_t mo = j->mask_per_seq ? (size_t)bb * j->L * j->S : 0;
    *q = (attn_seq){.L = j->L, .S = j->S, .causal = j->causal, .weights = j->weights};
    if (j->kpm) q->key_padding_mask = j->kpm + (size_t)bb * j->S;
    if (j->mask_bool) q->attn_mask_bool = j->mask_bool + mo;
    if (j->mask_add) q->attn_mask_add = j->mask_add + mo;
    if (j->positions) q->positions = j->positions + (size_t)bb * j->L;
    q->sel = (attn_select){.heads = j->sel.heads,
                           .n_heads = j->sel.heads ? j->sel.n_heads : 0,
                           .row0 = j->sel.row0,
                           .row1 = j->sel.row1,
                           .top_k = j->sel.top_k};
    size_t per_seq = (size_t)(attnd_job_attention_floats(j, H) / (uint64_t)j->B);
    if (j->attn) q->attn = j->attn + (size_t)bb * per_seq;
    if (j->attn_idx) q->attn_idx = j->attn_idx + (size_t)bb * per_seq;
    if (r->step.table) { /* a session step: its rows attend over the cache, causally */
        if (m->attn16)
            q->kv16 = r->step.st.kv;
        else
            q->kv = r->step.st.kv;
        q->cached = r->step.st.len;
        q->causal = 0;
    }
}

static void describe_sequences(batch_run *br, attn_seq *seqs) {
    size_t si = 0;
    for (int i = 0; i < br->n; i++)
        for (int bb = 0; bb < br->rs[i]->job.B; bb++)
            describe(&seqs[si++], br->rs[i], bb, br->m);
    br->b.B = (int)si;
    br->b.seqs = seqs;
}

/* Mixed batches: a batch may hold self-attention and cross-attention
 * requests of the same model. When every request is self-attention the
 * batch goes to the core with key == NULL (one QKV projection); otherwise
 * the self-attention queries are copied in as their own keys and values
 * (the core's numbers are the same either way: docs/performance.md). A
 * KV-cache session step is a self-attention sequence whose attn_seq
 * carries its session's cache; such batches are all self-attention.
 */
/* Packs the requests into one attn_batch; on failure br->fail and err. */
static void pack(batch_run *br) {
    attnd_pipeline *p = br->p;
    measure(br, p->off);
    const char *why = alloc_attention(br) < 0 ? "out of memory for attention matrices"
                      : reserve(p, br) < 0    ? "out of memory packing a batch"
                                              : NULL;
    if (why) {
        snprintf(br->err, sizeof(br->err), "%s", why);
        br->fail = 1;
        return;
    }
    memset(&br->b, 0, sizeof(br->b));
    if (br->n == 1) {
        const attnd_job *j = &br->rs[0]->job;
        br->b.query = j->query;
        br->b.key = j->self ? NULL : j->key;
        br->b.value = j->self ? NULL : j->value;
    } else {
        attn_ctx_parallel(p->ctx, br->n, pack_task, br);
        br->b.query = p->q;
        br->b.key = br->all_self ? NULL : p->k;
        br->b.value = br->all_self || !br->need_value ? NULL : p->v;
    }
    describe_sequences(br, p->seqs);
    br->b.out = p->out;
}

/* ---- step 2: compute ---- */

static void compute(batch_run *br) {
    br->t0 = attnd_mono_us();
    if (!br->fail && attn_forward(br->p->ctx, br->m, &br->b, br->err, sizeof(br->err)) < 0)
        br->fail = 1;
    br->t1 = attnd_mono_us();
    attnd_metrics *mt = br->mt;
    if (br->fail || !mt) return;
    attnd_hist_observe(&mt->compute_seconds[br->m->precision], br->t1 - br->t0);
    attnd_hist_observe(&mt->batch_size, (uint64_t)br->n);
    attnd_hist_observe(&mt->batch_tokens, (uint64_t)br->tokens);
    atomic_fetch_add_explicit(&mt->tokens, (uint64_t)br->tokens, memory_order_relaxed);
}

/* ---- step 3: answer ---- */

/* Request i's rows of the batch's output. */
static const float *output_of(const batch_run *br, int i) {
    return br->p->out + br->p->off[3 * (size_t)i];
}

/* 1 when request i's output and attention matrices are finite. */
static int result_finite(const batch_run *br, int i) {
    const attnd_job *j = &br->rs[i]->job;
    size_t nout = (size_t)j->B * j->L * br->m->hp.embed_dim;
    uint64_t na = j->attn ? attnd_job_attention_floats(j, br->m->hp.num_heads) : 0;
    return attnd_first_nonfinite(output_of(br, i), nout, 0) == nout &&
           attnd_first_nonfinite(j->attn, na, 0) == na;
}

/* Answers request i at once when it gets no output: the compute failed,
 * the result overflows, or its deadline passed. Returns 1 when it did. */
static int answered_early(batch_run *br, int i) {
    attnd_req *r = br->rs[i];
    attnd_error e;
    if (br->fail) {
        attnd_set_error(&e, AERR_INTERNAL, "compute failed: %.200s", br->err);
        refuse(br, r, &e);
    } else if (!result_finite(br, i)) {
        /* the input's magnitudes did it: a client error, not the server's */
        attnd_set_error(&e, AERR_BAD_REQUEST, "%s", ATTND_MSG_OVERFLOW);
        refuse(br, r, &e);
    } else if (attnd_mono_us() > r->deadline_us) {
        attnd_req_timeout(r);
        answered(br, r, 0);
    } else {
        return 0;
    }
    return 1;
}

/* Request i's times, then its checks (a pool task); keep[i] = 1 when its
 * answer is left to write. */
static void check_task(void *arg, int i, int thread) {
    (void)thread;
    batch_run *br = arg;
    attnd_req *r = br->rs[i];
    r->t_start_us = br->t0;
    r->t_end_us = br->t1;
    r->batch_requests = br->n;
    if (br->mt) attnd_hist_observe(&br->mt->queue_seconds, br->t0 - r->t_admit_us);
    br->p->keep[i] = !answered_early(br, i);
}

/* Answer a, written (answer.c), goes into its request: 201 for the step
 * that opened a session natively. */
static void answer_written(void *arg, int a) {
    batch_run *br = arg;
    const attnd_answer *an = &br->p->answers[a];
    attnd_req *r = br->rs[br->p->who[a]];
    if (!an->body) {
        attnd_error e;
        attnd_set_error(&e, AERR_INTERNAL, "out of memory writing the answer");
        refuse(br, r, &e);
        return;
    }
    int created = r->step.opened && r->job.api != API_V2;
    attnd_reply_set(&r->reply, created ? AOK_CREATED : AOK, an->body, an->body_len, an->json_len);
    attnd_job_drop_inputs(&r->job); /* no longer needed: freed now, not at completion */
    answered(br, r, 1);
}

/* The answer of request i, to write: a session step's carries its id and
 * its cached tokens. */
static attnd_answer answer_of(const batch_run *br, int i) {
    const attnd_req *r = br->rs[i];
    return (attnd_answer){.job = &r->job,
                          .model = br->info,
                          .out = output_of(br, i),
                          .usage = {.batch_requests = br->n,
                                    .queue_us = br->t0 - r->t_admit_us,
                                    .compute_us = br->t1 - br->t0,
                                    .session = r->step.table ? r->step.id : NULL,
                                    .cached_tokens = r->job.S}};
}

/* Checks every request of the batch, then writes the answers left over the
 * whole pool: a large one in chunks on every thread (answer.h). */
static void answer(batch_run *br) {
    attnd_pipeline *p = br->p;
    attn_ctx_parallel(p->ctx, br->n, check_task, br);
    int na = 0;
    for (int i = 0; i < br->n; i++) {
        if (!p->keep[i]) continue;
        p->who[na] = i;
        p->answers[na++] = answer_of(br, i);
    }
    attnd_write_answers(p->ctx, p->answers, na, answer_written, br);
}

void attnd_pipeline_run(attnd_pipeline *p, const attn_model *m, const attnd_model_info *info,
                        attnd_metrics *mt, attnd_req **rs, int n, attnd_answered_fn done,
                        void *arg) {
    batch_run br = {
        .p = p, .rs = rs, .n = n, .m = m, .info = info, .mt = mt, .done = done, .arg = arg};
    if (n > p->cap) { /* the caller's mistake: every request refused, none packed */
        attnd_error e;
        attnd_set_error(&e, AERR_INTERNAL, "a batch of %d requests, the pipeline takes %d", n,
                        p->cap);
        for (int i = 0; i < n; i++)
            refuse(&br, rs[i], &e);
        return;
    }
    pack(&br);
    compute(&br);
    answer(&br);
}
