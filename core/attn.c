/* attn.c - the fast forward of one attention layer over a ragged batch.
 *
 *   1. projections: over all T query tokens (and U key tokens) of the batch
 *      at once, on the weights packed at load (proj.c, gemm.c): Q, K and V
 *      land side by side (QKV (T,3E) for self-attention; Q (T,E) and KV
 *      (U,2E) for cross-attention), as one parallel loop of tiles;
 *   2. per (sequence, head, block of query rows): QK^T, softmax (softmax.c)
 *      and AV with OpenBLAS. With no attention matrix asked for, keys are taken in tiles
 *      with an online softmax, so no (L,S) matrix is ever held (in fused.c's
 *      AVX-512 kernel where the CPU and head width allow it); otherwise the
 *      rows' full score matrix is built where the caller wants the weights.
 *      Each block's head output overwrites its own (already used) q columns;
 *   3. out projection over all tokens, the same way.
 * Every step splits over the context's own threads; OpenBLAS stays at one
 * thread (README, "The core", says why). A sequence's numbers do not depend
 * on what else is in the batch nor on the thread count: the tiles of step 1
 * and 3 compute each output alike (gemm.c), and step 2's tasks are cut from
 * each sequence alone (docs/performance.md). The context's threads and
 * scratch live in ctx.c. Legend: see attn.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "internal.h"

#ifndef ATTN_QB /* -DATTN_QB=... and -DATTN_KB=... for tuning builds */
#define ATTN_QB 128
#endif
#ifndef ATTN_KB
#define ATTN_KB 256
#endif
enum {
    QB = ATTN_QB,          /* query rows per tile (online softmax path) */
    KB = ATTN_KB,          /* key rows per tile (online softmax path) */
    FULL_FLOATS = 1 << 18, /* score floats per task on the weights path */
};

/* ---- attention --------------------------------------------------------- */

typedef struct {
    const attn_model *m;
    const attn_batch *b;
    float **tile; /* (threads) scratch */
    float *q;     /* (T,E) at row stride ldq: projected queries, then head outputs */
    size_t ldq;
    const float *k; /* (U,E) at row stride ldk */
    size_t ldk;
    const float *v; /* (U,E) at row stride ldv */
    size_t ldv;
    const size_t *qoff, *koff; /* (B) first query / key row of each sequence */
    float scale;               /* 1 / sqrt(D) */
} fwd_state;

/* Hides masked scores of rows [i0, i0+Lb) x keys [j0, j0+Sb) (ld = ldsc):
 * -inf where hidden, the additive mask added elsewhere. */
static void mask_scores(float *sc, int ldsc, const attn_seq *s, int i0, int Lb, int j0, int Sb) {
    int causal = s->causal && j0 + Sb - 1 > i0;
    if (!causal && !s->key_padding_mask && !s->attn_mask_bool && !s->attn_mask_add) return;
    for (int r = 0; r < Lb; r++) {
        int i = i0 + r;
        float *row = sc + (size_t)r * ldsc;
        size_t mrow = (size_t)i * s->S + j0;
        if (s->attn_mask_add)
            for (int c = 0; c < Sb; c++)
                row[c] += s->attn_mask_add[mrow + c];
        if (s->key_padding_mask)
            for (int c = 0; c < Sb; c++)
                if (s->key_padding_mask[j0 + c]) row[c] = -INFINITY;
        if (s->attn_mask_bool)
            for (int c = 0; c < Sb; c++)
                if (s->attn_mask_bool[mrow + c]) row[c] = -INFINITY;
        if (causal)
            for (int c = i + 1 - j0 > 0 ? i + 1 - j0 : 0; c < Sb; c++)
                row[c] = -INFINITY;
    }
}

/* Tile floats one thread needs for the online softmax path. */
static size_t tiled_floats(int D) {
    if (attn_fused_supported(D)) return attn_fused_floats(D);
    return (size_t)QB * KB + (size_t)QB * D + 2 * QB;
}

/* Query rows per task on the online softmax path. */
static int tiled_rows(int D) {
    return attn_fused_supported(D) ? ATTN_FUSED_ROWS : QB;
}

/* One (sequence, head, row block) with an online softmax over key tiles:
 * never more than a QB x KB block of scores. */
static void attend_tiled(const fwd_state *st, const attn_task *tk, float *scratch) {
    const attn_seq *s = &st->b->seqs[tk->seq];
    int H = st->m->hp.num_heads, D = st->m->hp.embed_dim / H;
    int i0 = tk->i0, Lb = tk->i1 - tk->i0;
    float *q = st->q + (st->qoff[tk->seq] + i0) * st->ldq + (size_t)tk->head * D; /* (Lb,D) */
    const float *k = st->k + st->koff[tk->seq] * st->ldk + (size_t)tk->head * D;  /* (S,D) */
    const float *v = st->v + st->koff[tk->seq] * st->ldv + (size_t)tk->head * D;  /* (S,D) */
    if (attn_fused_supported(D)) {
        attn_fused_block(q, st->ldq, q, st->ldq, k, st->ldk, v, st->ldv, s, i0, Lb, D, st->scale,
                         scratch);
        return;
    }
    float *sc = scratch;               /* (Lb,KB) scores, then probabilities */
    float *acc = sc + (size_t)QB * KB; /* (Lb,D) unnormalised output */
    float *mx = acc + (size_t)QB * D;  /* (Lb) running row max */
    float *sum = mx + QB;              /* (Lb) running row sum */
    memset(acc, 0, sizeof(float) * (size_t)Lb * D);
    for (int r = 0; r < Lb; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
    int jend = s->S;
    if (s->causal && jend > tk->i1) jend = tk->i1; /* later keys are hidden from every row */
    for (int j0 = 0; j0 < jend; j0 += KB) {
        int Sb = jend - j0 < KB ? jend - j0 : KB;
        // q (Lb,D) @ k^T (D,Sb) * scale -> sc (Lb,Sb)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lb, Sb, D, st->scale, q, (int)st->ldq,
                   k + (size_t)j0 * st->ldk, (int)st->ldk, 0.0f, sc, Sb);
        mask_scores(sc, Sb, s, i0, Lb, j0, Sb);
        attn_softmax_online(sc, Sb, Lb, Sb, mx, sum, acc, D);
        // p (Lb,Sb) @ v (Sb,D) + acc -> acc (Lb,D)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Lb, D, Sb, 1.0f, sc, Sb,
                   v + (size_t)j0 * st->ldv, (int)st->ldv, 1.0f, acc, D);
    }
    for (int r = 0; r < Lb; r++) {
        float inv = sum[r] > 0 ? 1.0f / sum[r] : 0.0f; /* all keys hidden: 0 */
        for (int d = 0; d < D; d++)
            q[(size_t)r * st->ldq + d] = acc[(size_t)r * D + d] * inv;
    }
}

/* Query rows per task on the weights path, so that a block of scores stays
 * near FULL_FLOATS. */
static int full_rows(int S) {
    int r = FULL_FLOATS / S;
    if (r > QB) r = QB;
    if (r < 8) r = 8;
    return r;
}

/* One (sequence, row block), every head, with the full rows of scores: the
 * attention matrix is asked for. */
static void attend_full(const fwd_state *st, const attn_task *tk, float *scratch) {
    const attn_seq *s = &st->b->seqs[tk->seq];
    int H = st->m->hp.num_heads, D = st->m->hp.embed_dim / H, L = s->L, S = s->S;
    int i0 = tk->i0, Lb = tk->i1 - tk->i0;
    int jend = S;
    if (s->causal && jend > tk->i1) jend = tk->i1;
    float invH = 1.0f / (float)H;
    float *mean = s->weights == ATTN_WEIGHTS_MEAN ? s->attn + (size_t)i0 * S : NULL; /* (Lb,S) */
    for (int h = 0; h < H; h++) {
        float *q = st->q + (st->qoff[tk->seq] + i0) * st->ldq + (size_t)h * D; /* (Lb,D) */
        const float *k = st->k + st->koff[tk->seq] * st->ldk + (size_t)h * D;  /* (S,D) */
        const float *v = st->v + st->koff[tk->seq] * st->ldv + (size_t)h * D;  /* (S,D) */
        float *P = s->weights == ATTN_WEIGHTS_HEADS ? s->attn + ((size_t)h * L + i0) * S
                                                    : scratch; /* (Lb,S) */
        // q (Lb,D) @ k^T (D,jend) * scale -> P (Lb,jend), ld S
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Lb, jend, D, st->scale, q, (int)st->ldq,
                   k, (int)st->ldk, 0.0f, P, S);
        mask_scores(P, S, s, i0, Lb, 0, jend);
        attn_softmax_rows(P, S, Lb, jend, S);
        // P (Lb,jend) @ v (jend,D) -> q's own columns (Lb,D): q is used up
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Lb, D, jend, 1.0f, P, S, v,
                   (int)st->ldv, 0.0f, q, (int)st->ldq);
        if (mean) {
            for (size_t e = 0; e < (size_t)Lb * S; e++)
                mean[e] = h == 0 ? P[e] * invH : mean[e] + P[e] * invH;
        }
    }
}

typedef struct {
    const fwd_state *st;
    const attn_task *tasks;
} attend_job;

static void attend_task(void *arg, int t, int tid) {
    const attend_job *j = arg;
    const attn_task *tk = &j->tasks[t];
    float *scratch = j->st->tile[tid];
    if (tk->head >= 0)
        attend_tiled(j->st, tk, scratch);
    else
        attend_full(j->st, tk, scratch);
}

/* ---- planning ---------------------------------------------------------------- */

static void plan(const attn_model *m, const attn_batch *b, size_t T, size_t U, attn_ws_size *p) {
    int E = m->hp.embed_dim, H = m->hp.num_heads, D = E / H;
    p->proj = b->key ? T * E + U * 2 * (size_t)E : T * 3 * (size_t)E;
    p->tile = 0;
    p->tasks = 0;
    p->seqs = (size_t)b->B;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        if (s->weights == ATTN_WEIGHTS_NONE) {
            p->tasks += (size_t)H * ((s->L + tiled_rows(D) - 1) / tiled_rows(D));
            if (tiled_floats(D) > p->tile) p->tile = tiled_floats(D);
        } else {
            int rows = full_rows(s->S);
            p->tasks += (s->L + rows - 1) / rows;
            size_t need = (size_t)rows * s->S;
            if (need > p->tile) p->tile = need;
        }
    }
}

size_t attn_workspace_bytes(const attn_model *m, const attn_batch *b, int nthreads) {
    size_t T = 0, U = 0;
    for (int i = 0; i < b->B; i++) {
        T += b->seqs[i].L;
        U += b->seqs[i].S;
    }
    attn_ws_size p;
    plan(m, b, T, U, &p);
    return attn_ws_bytes(&p, nthreads);
}

/* Fills the task list: later row blocks first (they cost more under causal). */
static size_t make_tasks(attn_task *tasks, const attn_batch *b, int H, int D) {
    size_t n = 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        int rows = s->weights == ATTN_WEIGHTS_NONE ? tiled_rows(D) : full_rows(s->S);
        int blocks = (s->L + rows - 1) / rows;
        for (int blk = blocks - 1; blk >= 0; blk--) {
            int i0 = blk * rows, i1 = i0 + rows < s->L ? i0 + rows : s->L;
            if (s->weights == ATTN_WEIGHTS_NONE)
                for (int h = 0; h < H; h++)
                    tasks[n++] = (attn_task){i, h, i0, i1};
            else
                tasks[n++] = (attn_task){i, -1, i0, i1};
        }
    }
    return n;
}

/* ---- cache steps in a batch ---------------------------------------------- */

/* A batch that holds cache steps: the steps through attn_step_forward, the
 * whole sequences (their rows copied out of the packed batch and their
 * outputs back) through the forward of their kind. */
static int forward_with_steps(attn_ctx *ctx, const attn_model *m, attn_batch *b, int nsteps,
                              char *err, size_t errlen) {
    int E = m->hp.embed_dim, nwhole = b->B - nsteps, rc = -1;
    size_t tw = 0;
    for (int i = 0; i < b->B; i++)
        if (!b->seqs[i].kv) tw += (size_t)b->seqs[i].L;
    attn_step *steps = calloc(nsteps > 0 ? (size_t)nsteps : 1, sizeof *steps);
    attn_seq *whole = calloc(nwhole > 0 ? (size_t)nwhole : 1, sizeof *whole);
    float *wq = malloc(sizeof(float) * (tw ? tw : 1) * (size_t)E * 2); /* (tw,E) in, then out */
    if (!steps || !whole || !wq) {
        snprintf(err, errlen, "out of memory for a batch of %d cache steps", nsteps);
        goto cleanup;
    }
    float *wo = wq + tw * (size_t)E;
    size_t t = 0, w = 0;
    for (int i = 0, ns = 0, nw = 0; i < b->B; t += (size_t)b->seqs[i].L, i++) {
        const attn_seq *s = &b->seqs[i];
        if (s->kv) {
            steps[ns++] = (attn_step){.n = s->L,
                                      .len = s->cached,
                                      .kv = s->kv,
                                      .query = b->query + t * E,
                                      .out = b->out + t * E,
                                      .weights = s->weights,
                                      .attn = s->attn};
            continue;
        }
        whole[nw++] = *s;
        memcpy(wq + w * E, b->query + t * E, sizeof(float) * (size_t)s->L * E);
        w += (size_t)s->L;
    }
    if (attn_step_forward(ctx, m, steps, nsteps, err, errlen) < 0) goto cleanup;
    attn_batch sub = {.B = nwhole, .seqs = whole, .query = wq, .out = wo};
    if (nwhole && attn_forward(ctx, m, &sub, err, errlen) < 0) goto cleanup;
    t = w = 0;
    for (int i = 0; nwhole && i < b->B; t += (size_t)b->seqs[i].L, i++) {
        if (b->seqs[i].kv) continue;
        memcpy(b->out + t * E, wo + w * E, sizeof(float) * (size_t)b->seqs[i].L * E);
        w += (size_t)b->seqs[i].L;
    }
    rc = 0;
cleanup:
    free(wq);
    free(whole);
    free(steps);
    return rc;
}

int attn_forward(attn_ctx *ctx, const attn_model *m, attn_batch *b, char *err, size_t errlen) {
    size_t T, U;
    int nsteps = 0;
    for (int i = 0; b->seqs && i < b->B; i++)
        nsteps += b->seqs[i].kv != NULL;
    if (nsteps) {
        if (attn_check_batch(m, b, &T, &U, err, errlen) < 0) return -1;
        return forward_with_steps(ctx, m, b, nsteps, err, errlen);
    }
    if (m->mem && !attn_is_mha(&m->hp)) return attn_forward_decoder(ctx, m, b, err, errlen);
    if (attn_check_batch(m, b, &T, &U, err, errlen) < 0) return -1;
    if (attn_check_packed(m, err, errlen) < 0) return -1;
    int E = m->hp.embed_dim, H = m->hp.num_heads, D = E / H;
    int Kd = m->hp.kdim, Vd = m->hp.vdim;
    attn_ws_size p;
    attn_ws ws;
    plan(m, b, T, U, &p);
    if (attn_ctx_reserve(ctx, &p, &ws) < 0) {
        snprintf(err, errlen, "out of memory for a batch of %zu query and %zu key tokens", T, U);
        return -1;
    }
    attn_pool *pool = attn_ctx_pool(ctx);
    fwd_state st = {.m = m, .b = b, .tile = ws.tile, .scale = 1.0f / sqrtf((float)D)};
    size_t *qoff = ws.off, *koff = ws.off + b->B;
    for (int i = 0, qo = 0, ko = 0; i < b->B; i++) {
        qoff[i] = qo;
        koff[i] = ko;
        qo += b->seqs[i].L;
        ko += b->seqs[i].S;
    }
    st.qoff = qoff;
    st.koff = koff;

    proj_part parts[PROJ_PARTS];
    if (!b->key) {
        // query (T,E) @ [Wq;Wk;Wv]^T (E,3E) + [bq;bk;bv] -> QKV (T,3E)
        float *qkv = ws.proj;
        size_t ld = 3 * (size_t)E;
        parts[0] = proj_part_of(m, 0, qkv, ld, b->query, E, T);
        parts[1] = proj_part_of(m, 1, qkv + E, ld, b->query, E, T);
        parts[2] = proj_part_of(m, 2, qkv + 2 * E, ld, b->query, E, T);
        st.q = qkv;
        st.k = qkv + E;
        st.v = qkv + 2 * E;
        st.ldq = st.ldk = st.ldv = ld;
    } else {
        float *q = ws.proj, *kv = ws.proj + T * E;
        const float *value = b->value ? b->value : b->key; /* value = key */
        size_t ldv = b->value ? (size_t)Vd : (size_t)Kd;
        // query (T,E) @ Wq^T (E,E) + bq -> Q (T,E)
        parts[0] = proj_part_of(m, 0, q, E, b->query, E, T);
        // key (U,Kd) @ Wk^T (Kd,E) + bk -> K (U,E); value (U,Vd) @ Wv^T + bv -> V (U,E)
        parts[1] = proj_part_of(m, 1, kv, 2 * (size_t)E, b->key, Kd, U);
        parts[2] = proj_part_of(m, 2, kv + E, 2 * (size_t)E, value, ldv, U);
        st.q = q;
        st.ldq = E;
        st.k = kv;
        st.v = kv + E;
        st.ldk = st.ldv = 2 * (size_t)E;
    }
    proj_run(pool, attn_ctx_threads(ctx), parts, 3);

    size_t ntasks = make_tasks(ws.tasks, b, H, D);
    attend_job job = {&st, ws.tasks};
    attn_pool_run(pool, (int)ntasks, attend_task, &job);

    // heads (T,E) @ Wo^T (E,E) + bo -> out (T,E)
    parts[0] = proj_part_of(m, 3, b->out, E, st.q, st.ldq, T);
    proj_run(pool, attn_ctx_threads(ctx), parts, 1);
    return 0;
}
