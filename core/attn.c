/* attn.c - the forward of one attention layer over a ragged batch: the one
 * road of every batch, for nn.MultiheadAttention and decoder models alike
 * (grouped key/value heads, head_dim, scale, rotary positions), self- and
 * cross-attention, whole sequences and KV-cache session steps mixed.
 * Multi-head attention is the case G == H, no rotation, D = E/H; a step is
 * a sequence whose earlier keys and values are cached.
 *
 *   1. projections: over all T query tokens (and U key tokens) of the batch
 *      at once, on the weights packed at load (proj.c, gemm.c): Q, K and V
 *      land side by side (QKV (T, H*D + 2*G*D) for self-attention; Q
 *      (T, H*D) and KV (U, 2*G*D) for cross-attention), as one parallel
 *      loop of tiles;
 *   2. positions and caches, one parallel loop over rows, when a row needs
 *      either: rotary positions on its q and k (rope.c), and a step's key
 *      and value rows copied into its cache at [cached, cached+L) (rounded
 *      into its bf16 pages for a model that attends in bf16); then, for
 *      such a model, whole sequences' keys and values packed into bf16
 *      pages, one parallel loop over pages;
 *   3. attention: tasks of (sequence, key/value head, row block), or
 *      (sequence, row block) when an attention matrix is asked for, on
 *      attend.c's kernels (the fused AVX-512 block, the OpenBLAS tiles, or
 *      whole rows), or attend_bf16.c's on bf16 pages; a step's rows read
 *      its cache, at positions cached .. cached+L-1, causally. A sequence
 *      that selects a part of its matrices (attn_select) has its weights
 *      computed first, by select.c's tasks in a loop of their own, then its
 *      output as with no matrix;
 *   4. out projection over all tokens, the same way as 1.
 * A model that computes in bf16 (attn_model.precision, settled at load) is
 * no second forward: its projections take the bf16 kernels (proj.c), and
 * with attn_model.attn16 its attention reads bf16 pages; the plan reads
 * both from the model.
 * Every step splits over the context's own threads; OpenBLAS stays at one
 * thread (README, "The core", says why). A sequence's numbers do not depend
 * on what else is in the batch nor on the thread count: the tiles of 1 and
 * 4 compute each output alike (gemm.c), 2 is per row, and 3's tasks are cut
 * from each sequence alone, or on the fused kernel, whose rows' bits do not
 * depend on their block, into blocks that give every thread a task
 * (docs/performance.md). This file plans and
 * orders; the kernels live in gemm.c, rope.c, attend.c, fused.c and
 * softmax.c, the scratch in ctx.c. attn_plan_describe, at the end, lists
 * the loops a forward would run, cut by the same functions, as data
 * (bench/bench_scale.c simulates them at thread counts a machine does not
 * have). Legend: see attn.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "internal.h"

enum { PREP_ROWS = 32 }; /* rows per task of step 2 */

/* One forward: its plan, then where its projections are. */
typedef struct {
    const attn_model *m;
    const attn_batch *b;
    size_t T, U;
    int QW, KW, W;      /* widths: H*D, G*D, H*D + 2*G*D */
    attn_attend at;     /* the attention: shape, then q and the tasks */
    attn_ws_size need;  /* scratch */
    int prep;           /* 1: step 2 runs (rotary positions or steps) */
    const float *k, *v; /* (U or T, G*D) at row stride ldkv: whole sequences' */
    size_t ldkv;        /* keys and values */
    attn_seq_at *seqs;  /* (B) */
    double *freqs;      /* (rope.dim / 2) */
    size_t pages;       /* attn16: bf16 pages of whole sequences' keys and values */
    attn_bf16 *kv16;    /* attn16: (pages) of them */
    attn_bf16 *a16;     /* BF16: the projections' inputs rounded (proj_run) */
} fwd;

static void plan(fwd *f, const attn_model *m, const attn_batch *b, size_t T, size_t U,
                 int nthreads) {
    const attn_hparams *hp = &m->hp;
    int H = hp->num_heads, G = hp->num_kv_heads, D = hp->head_dim;
    *f = (fwd){.m = m, .b = b, .T = T, .U = U, .QW = H * D, .KW = G * D};
    f->W = f->QW + 2 * f->KW;
    f->at = (attn_attend){.H = H, .G = G, .D = D, .scale = attn_scale(hp)};
    f->at.rows_alone = !attn_is_mha(hp);
    f->at.bf16 = m->attn16;
    f->at.fused = !f->at.bf16 && attn_fused_supported(D) && H / G <= ATTN_FUSED_ROWS;
    f->need.proj = b->key ? T * f->QW + U * 2 * (size_t)f->KW : T * f->W;
    f->prep = hp->rope.dim > 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        size_t tile = attn_attend_floats(&f->at, s);
        if (tile > f->need.tile) f->need.tile = tile;
        if (attn_seq_step(s)) f->prep = 1;
        if (f->at.bf16 && !attn_seq_step(s))
            f->pages += ((size_t)s->S + ATTN_KV_PAGE - 1) / ATTN_KV_PAGE;
    }
    attn_attend_cut(&f->at, b, nthreads);
    f->need.kv16 = attn_kv_bf16_elems(f->pages * ATTN_KV_PAGE, G, D);
    if (m->precision == ATTN_BF16) { /* inputs rounded once: query (key, value), then heads */
        size_t in = proj_rounded_elems(T, hp->embed_dim);
        if (b->key) in += proj_rounded_elems(U, hp->kdim);
        if (b->value) in += proj_rounded_elems(U, hp->vdim);
        size_t out = proj_rounded_elems(T, f->QW);
        f->need.a16 = in > out ? in : out;
    }
    f->need.tasks = attn_attend_tasks(&f->at, b, NULL, NULL);
    f->need.seqs = (size_t)b->B;
    f->need.freqs = (size_t)hp->rope.dim / 2;
}

/* Query and key tokens of a batch, unchecked. */
static void batch_tokens(const attn_batch *b, size_t *T, size_t *U) {
    *T = *U = 0;
    for (int i = 0; i < b->B; i++) {
        *T += b->seqs[i].L;
        *U += b->seqs[i].S;
    }
}

/* Whether step 4's tiles go to the threads by bands of rows: when step 3
 * gives every thread whole sequences (its tasks go sequence by sequence,
 * and pool.c hands each thread a contiguous share), a thread's band of
 * rows is then the rows its own attention tasks just wrote, still in its
 * core's cache; with fewer sequences than threads, step 3 splits by heads
 * and the default order (column blocks, weights shared by neighbours)
 * stays. */
static int out_by_rows(const attn_batch *b, int nthreads) {
    return nthreads > 1 && b->B >= nthreads;
}

/* Tasks of step 2 for T query rows. */
static size_t prep_tasks(size_t T) {
    return (T + PREP_ROWS - 1) / PREP_ROWS;
}

size_t attn_workspace_bytes(const attn_model *m, const attn_batch *b, int nthreads) {
    size_t T, U;
    batch_tokens(b, &T, &U);
    fwd f;
    plan(&f, m, b, T, U, nthreads);
    return attn_ws_bytes(&f.need, nthreads);
}

/* Step 1 into proj; sets where q, k and v are. */
static void project(fwd *f, attn_ctx *ctx, float *proj) {
    const attn_model *m = f->m;
    const attn_batch *b = f->b;
    int E = m->hp.embed_dim;
    size_t T = f->T, ld2 = 2 * (size_t)f->KW;
    proj_part parts[PROJ_PARTS];
    if (!b->key) {
        // query (T,E) @ [Wq;Wk;Wv]^T (E,W) + [bq;bk;bv] -> QKV (T,W)
        parts[0] = proj_part_of(m, 0, proj, f->W, b->query, E, T);
        parts[1] = proj_part_of(m, 1, proj + f->QW, f->W, b->query, E, T);
        parts[2] = proj_part_of(m, 2, proj + f->QW + f->KW, f->W, b->query, E, T);
        f->at.ldq = f->ldkv = f->W;
        f->k = proj + f->QW;
    } else {
        float *kv = proj + T * f->QW;
        const float *value = b->value ? b->value : b->key; /* value = key */
        size_t ldv = b->value ? (size_t)m->hp.vdim : (size_t)m->hp.kdim;
        // query (T,E) @ Wq^T (E,H*D) + bq -> Q (T,H*D)
        parts[0] = proj_part_of(m, 0, proj, f->QW, b->query, E, T);
        // key (U,Kd) @ Wk^T (Kd,G*D) + bk -> K (U,G*D); value (U,Vd) @ Wv^T + bv -> V
        parts[1] = proj_part_of(m, 1, kv, ld2, b->key, m->hp.kdim, f->U);
        parts[2] = proj_part_of(m, 2, kv + f->KW, ld2, value, ldv, f->U);
        f->at.ldq = f->QW;
        f->ldkv = ld2;
        f->k = kv;
    }
    f->at.q = proj;
    f->v = f->k + f->KW;
    proj_run(attn_ctx_pool(ctx), attn_ctx_threads(ctx), parts, 3, 0, f->a16);
}

/* Where each sequence's rows are: a whole sequence's keys in the
 * projections (self-attention: its own rows), a step's in its cache. */
static void place(fwd *f) {
    size_t q0 = 0, u0 = 0, page0 = 0, page = attn_kv_bf16_elems(ATTN_KV_PAGE, f->at.G, f->at.D);
    for (int i = 0; i < f->b->B; i++) {
        const attn_seq *s = &f->b->seqs[i];
        attn_seq_at *a = &f->seqs[i];
        size_t row = f->b->key ? u0 : q0;
        *a = (attn_seq_at){.q0 = q0,
                           .k = f->k + row * f->ldkv,
                           .v = f->v + row * f->ldkv,
                           .ldkv = f->ldkv,
                           .view = *s};
        if (s->kv) { /* one row per token: rotated key (G,D), then value (G,D) */
            *a = (attn_seq_at){.q0 = q0,
                               .k = s->kv,
                               .v = s->kv + f->KW,
                               .ldkv = 2 * (size_t)f->KW,
                               .shift = s->cached,
                               .view = *s};
            a->view.causal = 1;
        }
        if (s->kv16) { /* bf16 pages, written by step 2 */
            *a = (attn_seq_at){.q0 = q0, .shift = s->cached, .view = *s, .kv16 = s->kv16};
            a->view.causal = 1;
        }
        a->page0 = page0;             /* a step owns no pages: the next sequence's first */
        if (f->at.bf16 && !s->kv16) { /* bf16 pages in the scratch, packed after step 2 */
            a->kv16 = f->kv16 + page0 * page;
            page0 += ((size_t)s->S + ATTN_KV_PAGE - 1) / ATTN_KV_PAGE;
        }
        q0 += (size_t)s->L;
        u0 += (size_t)s->S;
    }
}

/* Step 2 for row `row` of sequence i (self-attention): QKV's row rotated at
 * its position (q's H heads and k's G heads, side by side), and a step's
 * key and value row into its cache. */
static void prepare_row(const fwd *f, int i, int row) {
    const attn_seq *s = &f->b->seqs[i];
    float *x = f->at.q + (f->seqs[i].q0 + (size_t)row) * f->at.ldq; /* (W) */
    const attn_rope *rope = &f->m->hp.rope;
    if (rope->dim) {
        double pos = attn_seq_step(s) ? s->cached + row : s->positions ? s->positions[row] : row;
        attn_rope_row(x, f->at.H + f->at.G, f->at.D, rope, f->freqs, pos);
    }
    if (s->kv)
        memcpy(s->kv + (size_t)(s->cached + row) * 2 * f->KW, x + f->QW,
               sizeof(float) * 2 * (size_t)f->KW);
    if (s->kv16)
        attn_kv_bf16_put(s->kv16, f->at.G, f->at.D, (size_t)(s->cached + row), x + f->QW,
                         x + f->QW + f->KW);
}

/* The last sequence whose first row (rows: the batch's query rows) or first
 * page (rows == 0: whole sequences' bf16 pages) is at most r. */
static size_t seq_of(const fwd *f, size_t r, int rows) {
    int lo = 0, hi = f->b->B - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((rows ? f->seqs[mid].q0 : f->seqs[mid].page0) <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return (size_t)lo;
}

/* Rows [t * PREP_ROWS, +PREP_ROWS) of the batch through prepare_row. */
static void prepare_task(void *arg, int t, int tid) {
    (void)tid;
    const fwd *f = arg;
    size_t r0 = (size_t)t * PREP_ROWS, r1 = r0 + PREP_ROWS < f->T ? r0 + PREP_ROWS : f->T;
    for (size_t r = r0, i = seq_of(f, r0, 1); r < r1; r++) {
        while (r >= f->seqs[i].q0 + (size_t)f->b->seqs[i].L)
            i++;
        prepare_row(f, (int)i, (int)(r - f->seqs[i].q0));
    }
}

/* Whole sequences' page t: its keys and values (rotated) rounded into the
 * sequence's bf16 pages, zeros past its last token. */
static void pack_task(void *arg, int t, int tid) {
    (void)tid;
    const fwd *f = arg;
    const attn_seq_at *a = &f->seqs[seq_of(f, (size_t)t, 0)];
    size_t p = (size_t)t - a->page0, j0 = p * ATTN_KV_PAGE, S = (size_t)a->view.S;
    size_t n = S - j0 < ATTN_KV_PAGE ? S - j0 : ATTN_KV_PAGE;
    attn_bf16 *page = a->kv16 + p * attn_kv_bf16_elems(ATTN_KV_PAGE, f->at.G, f->at.D);
    attn_kv_bf16_pack(page, f->at.G, f->at.D, n, a->k + j0 * a->ldkv, a->ldkv, a->v + j0 * a->ldkv,
                      a->ldkv);
}

int attn_forward(attn_ctx *ctx, const attn_model *m, attn_batch *b, char *err, size_t errlen) {
    size_t T, U;
    if (!ctx) {
        snprintf(err, errlen, "a forward needs a compute context (attn_ctx_new)");
        return -1;
    }
    if (attn_check_batch(m, b, &T, &U, err, errlen) < 0) return -1;
    if (attn_check_packed(m, err, errlen) < 0) return -1;
    fwd f;
    attn_ws ws;
    plan(&f, m, b, T, U, attn_ctx_threads(ctx));
    if (attn_ctx_reserve(ctx, &f.need, &ws) < 0) {
        snprintf(err, errlen, "out of memory for a batch of %zu query and %zu key tokens", T, U);
        return -1;
    }
    attn_pool *pool = attn_ctx_pool(ctx);
    f.seqs = ws.seqs;
    f.freqs = ws.freqs;
    f.kv16 = ws.kv16;
    f.a16 = ws.a16;
    project(&f, ctx, ws.proj);
    place(&f);
    if (f.prep) {
        if (m->hp.rope.dim) attn_rope_freqs(&m->hp.rope, f.freqs);
        attn_pool_run(pool, (int)prep_tasks(T), prepare_task, &f);
    }
    if (f.pages) attn_pool_run(pool, (int)f.pages, pack_task, &f);
    f.at.seqs = ws.seqs;
    f.at.tasks = ws.tasks;
    f.at.tile = ws.tile;
    size_t nselect, ntasks = attn_attend_tasks(&f.at, b, ws.tasks, &nselect);
    if (nselect) /* selected weights first: they read the queries the others overwrite */
        attn_pool_run(pool, (int)nselect, attn_attend_task, &f.at);
    f.at.tasks = ws.tasks + nselect;
    attn_pool_run(pool, (int)(ntasks - nselect), attn_attend_task, &f.at);
    // heads (T,H*D) @ Wo^T (H*D,E) + bo -> out (T,E)
    proj_part out = proj_part_of(m, 3, b->out, m->hp.embed_dim, f.at.q, f.at.ldq, T);
    proj_run(pool, attn_ctx_threads(ctx), &out, 1, out_by_rows(b, attn_ctx_threads(ctx)), f.a16);
    return 0;
}

/* ---- the plan as data (attn_plan_describe) ------------------------------- */

/* Keys that rows [i0, i1) of sequence s read: all S, or under causal up to
 * the block's last row (a step is causal over its cache, its row 0 at
 * position cached, as place() sets its view). */
static int task_keys(const attn_seq *s, int i1) {
    int shift = s->kv ? s->cached : 0;
    return (s->causal || s->kv) && i1 + shift < s->S ? i1 + shift : s->S;
}

/* Step 3's n tasks (attn_attend_tasks, as the forward cuts them) into out
 * with their work. The selected weights' tasks come first: the forward runs
 * them as a loop of their own before the others; the plan counts them in
 * the one attention loop. Returns 0, or -1 when out of memory. */
static int describe_attend(attn_plan_task *out, const fwd *f, size_t n) {
    attn_task *tk = malloc(sizeof *tk * (n ? n : 1));
    if (!tk) return -1;
    attn_attend_tasks(&f->at, f->b, tk, NULL);
    int R = f->at.H / f->at.G;
    for (size_t t = 0; t < n; t++)
        out[t] = (attn_plan_task){ATTN_LOOP_ATTEND,
                                  tk[t].seq,
                                  tk[t].i1 - tk[t].i0,
                                  task_keys(&f->b->seqs[tk[t].seq], tk[t].i1),
                                  f->at.D,
                                  tk[t].head >= 0 ? R : f->at.H};
    free(tk);
    return 0;
}

/* Appends a loop of n tasks to p; a loop of none is left out. */
static void add_loop(attn_plan *p, attn_loop_kind kind, size_t n) {
    size_t first = p->nloops ? p->loops[p->nloops - 1].first + p->loops[p->nloops - 1].ntasks : 0;
    if (!n) return;
    p->loops[p->nloops].kind = kind;
    p->loops[p->nloops].first = first;
    p->loops[p->nloops++].ntasks = n;
}

int attn_plan_describe(attn_plan *out, const attn_model *m, const attn_batch *b, int nthreads,
                       char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (attn_check_packed(m, err, errlen) < 0) return -1;
    size_t T, U;
    batch_tokens(b, &T, &U);
    size_t M = b->key ? U : T; /* rows of the key and value projections */
    fwd f;
    plan(&f, m, b, T, U, nthreads);
    proj_part parts[PROJ_PARTS + 1] = {
        proj_part_of(m, 0, NULL, 0, NULL, 0, T), proj_part_of(m, 1, NULL, 0, NULL, 0, M),
        proj_part_of(m, 2, NULL, 0, NULL, 0, M), proj_part_of(m, 3, NULL, 0, NULL, 0, T)};
    size_t nq = proj_describe(NULL, ATTN_LOOP_PROJ, nthreads, parts, PROJ_PARTS, 0);
    size_t np = f.prep ? prep_tasks(T) : 0, na = f.need.tasks;
    int rows = out_by_rows(b, nthreads);
    size_t no = proj_describe(NULL, ATTN_LOOP_OUT, nthreads, parts + PROJ_PARTS, 1, rows);
    out->tasks = malloc(sizeof *out->tasks * (nq + np + na + no));
    if (!out->tasks || describe_attend(out->tasks + nq + np, &f, na) < 0) {
        attn_plan_free(out);
        snprintf(err, errlen, "out of memory for the plan of %zu query tokens", T);
        return -1;
    }
    out->ntasks = nq + np + na + no;
    add_loop(out, ATTN_LOOP_PROJ, nq);
    add_loop(out, ATTN_LOOP_PREP, np);
    add_loop(out, ATTN_LOOP_ATTEND, na);
    add_loop(out, ATTN_LOOP_OUT, no);
    proj_describe(out->tasks, ATTN_LOOP_PROJ, nthreads, parts, PROJ_PARTS, 0);
    for (size_t t = 0; t < np; t++) {
        size_t r0 = t * PREP_ROWS, rows = T - r0 < PREP_ROWS ? T - r0 : PREP_ROWS;
        out->tasks[nq + t] = (attn_plan_task){ATTN_LOOP_PREP, 0, (int)rows, 0, 0, 1};
    }
    proj_describe(out->tasks + nq + np + na, ATTN_LOOP_OUT, nthreads, parts + PROJ_PARTS, 1, rows);
    return 0;
}

void attn_plan_free(attn_plan *plan) {
    if (!plan) return;
    free(plan->tasks);
    memset(plan, 0, sizeof *plan);
}
