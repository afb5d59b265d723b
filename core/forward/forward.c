/* forward.c - the forward of one attention layer over a ragged batch: the
 * one road of every batch, for nn.MultiheadAttention and decoder models
 * alike, self- and cross-attention, whole sequences and KV-cache steps
 * mixed, in every precision the model's rows (ops.h) compute. It plans,
 * binds the plan to the context's scratch and runs its loops in order:
 *
 *   1. projections of all T query tokens (and U key tokens) at once: their
 *      inputs prepared once where the row prepares them (ROUND), then tiles
 *      (PROJ); Q, K and V land side by side (QKV (T, H*D + 2*G*D) for
 *      self-attention; Q (T, H*D) and KV (U, 2*G*D) for cross-attention);
 *   2. rotary positions and a step's key and value rows into its cache, a
 *      loop over rows when a row needs either (PREP); then, where the row
 *      reads bf16 pages, whole sequences' keys and values packed (PACK);
 *   3. attention: the selections' tasks first (SELECT), since they read the
 *      queries that the other tasks overwrite with head outputs, then the
 *      others (ATTEND; tasks/attend.c cuts them);
 *   4. the output projection over all tokens, as 1 (OUT_ROUND, OUT).
 * Every loop splits over the context's own threads; OpenBLAS stays at one
 * thread. A sequence's numbers do not depend on what else is in the batch
 * nor on the thread count (docs/performance.md, batch invariance).
 * attn_plan_describe (plan.c) lists the same loops, built by the same
 * fwd_loops. Legend: see attn.h.
 */
#include <stdio.h>
#include <string.h>

#include "../kernels/kv_pages.h"
#include "../ops/seq.h"
#include "../prim/rope.h"
#include "check.h"
#include "fwd.h"
#include "model.h"

void fwd_tokens(const attn_batch *b, size_t *T, size_t *U) {
    *T = *U = 0;
    for (int i = 0; i < b->B; i++) {
        *T += b->seqs[i].L;
        *U += b->seqs[i].S;
    }
}

/* Step 1's parts: outputs into proj (NULL: none yet, for sizes). */
static void in_parts(const fwd *f, float *proj, proj_part parts[PROJ_PARTS]) {
    const attn_model *m = f->m;
    const attn_batch *b = f->b;
    int E = m->hp.embed_dim;
    size_t T = f->T, ld2 = 2 * (size_t)f->KW;
    if (!b->key) {
        // query (T,E) @ [Wq;Wk;Wv]^T (E,W) + [bq;bk;bv] -> QKV (T,W)
        parts[0] = proj_part_of(f->proj, m, 0, proj, f->W, b->query, E, T);
        parts[1] = proj_part_of(f->proj, m, 1, proj ? proj + f->QW : NULL, f->W, b->query, E, T);
        parts[2] =
            proj_part_of(f->proj, m, 2, proj ? proj + f->QW + f->KW : NULL, f->W, b->query, E, T);
        return;
    }
    float *kv = proj ? proj + T * f->QW : NULL;
    const float *value = b->value ? b->value : b->key; /* value = key */
    size_t ldv = b->value ? (size_t)m->hp.vdim : (size_t)m->hp.kdim;
    // query (T,E) @ Wq^T (E,H*D) + bq -> Q (T,H*D)
    parts[0] = proj_part_of(f->proj, m, 0, proj, f->QW, b->query, E, T);
    // key (U,Kd) @ Wk^T (Kd,G*D) + bk -> K (U,G*D); value (U,Vd) @ Wv^T + bv -> V
    parts[1] = proj_part_of(f->proj, m, 1, kv, ld2, b->key, m->hp.kdim, f->U);
    parts[2] = proj_part_of(f->proj, m, 2, kv ? kv + f->KW : NULL, ld2, value, ldv, f->U);
}

/* Scratch of the attention: per thread, and the tasks. */
static void plan_attention(fwd *f) {
    const attn_batch *b = f->b;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        size_t tile = attn_attend_floats(&f->at, s);
        if (tile > f->need.tile) f->need.tile = tile;
        if (attn_seq_step(s)) f->prep = 1;
        if (f->at.ops->pages && !attn_seq_step(s)) f->pages += attn_kv_pages((size_t)s->S);
    }
    attn_attend_cut(&f->at, b, f->nthreads);
    f->ntasks = attn_attend_tasks(&f->at, b, NULL, &f->nselect);
}

void fwd_plan(fwd *f, const attn_model *m, const attn_batch *b, size_t T, size_t U, int nthreads) {
    const attn_hparams *hp = &m->hp;
    int H = hp->num_heads, G = hp->num_kv_heads, D = hp->head_dim;
    *f = (fwd){.m = m, .b = b, .nthreads = nthreads, .T = T, .U = U, .QW = H * D, .KW = G * D};
    f->W = f->QW + 2 * f->KW;
    f->at = (attn_attend){.H = H, .G = G, .D = D, .scale = attn_scale(hp)};
    attn_model_rows(m, &f->proj, &f->at.ops);
    f->at.rows_alone = !attn_is_mha(hp);
    f->at.ops->prepare(&f->at);
    f->prep = hp->rope.dim > 0;
    plan_attention(f);
    proj_part parts[PROJ_PARTS];
    in_parts(f, NULL, parts);
    proj_part out =
        proj_part_of(f->proj, m, 3, NULL, (size_t)hp->embed_dim, NULL, (size_t)f->QW, T);
    size_t in16 = proj_prepared_elems(parts, PROJ_PARTS), out16 = proj_prepared_elems(&out, 1);
    f->need = (attn_ws_size){
        .proj = b->key ? T * f->QW + U * 2 * (size_t)f->KW : T * f->W,
        .tile = f->need.tile,
        .tasks = f->ntasks * sizeof(attn_task),
        .seqs = (size_t)b->B * sizeof(attn_seq_at),
        .freqs = (size_t)hp->rope.dim / 2,
        .kv16 = f->pages * attn_kv_page_elems(G, D),
        .a16 = in16 > out16 ? in16 : out16, /* the output's inputs are prepared after */
    };
}

/* Whether the output projection's tiles go to the threads by bands of
 * rows: when the attention gives every thread whole sequences (its tasks
 * go sequence by sequence, and the pool hands each thread a contiguous
 * share), a thread's band of rows is then the rows its own attention tasks
 * just wrote, still in its core's cache; with fewer sequences than
 * threads, the attention splits by heads and the default order (column
 * blocks, weights shared by neighbours) stays. */
static int out_by_rows(const attn_batch *b, int nthreads) {
    return nthreads > 1 && b->B >= nthreads;
}

/* Where each sequence's rows are: a whole sequence's keys in the
 * projections (self-attention: its own rows), a step's in its cache. */
static void place(fwd *f) {
    size_t q0 = 0, u0 = 0, page0 = 0, page = attn_kv_page_elems(f->at.G, f->at.D);
    for (int i = 0; i < f->b->B; i++) {
        const attn_seq *s = &f->b->seqs[i];
        attn_seq_at *a = &f->seqs[i];
        size_t row = f->b->key ? u0 : q0;
        *a = (attn_seq_at){.q0 = q0, .view = *s, .page0 = page0};
        if (s->kv) { /* one row per token: rotated key (G,D), then value (G,D) */
            a->k = s->kv;
            a->v = s->kv + f->KW;
            a->ldkv = 2 * (size_t)f->KW;
        } else if (!s->kv16) {
            a->k = f->k + row * f->ldkv;
            a->v = f->v + row * f->ldkv;
            a->ldkv = f->ldkv;
        }
        if (attn_seq_step(s)) { /* causal over its cache, its row 0 at position cached */
            a->shift = s->cached;
            a->view.causal = 1;
            a->kv16 = s->kv16;         /* bf16 pages, written by the loop over rows */
        } else if (f->at.ops->pages) { /* bf16 pages in the scratch, packed after that loop */
            a->kv16 = f->kv16 + page0 * page;
            page0 += attn_kv_pages((size_t)s->S);
        }
        q0 += (size_t)s->L;
        u0 += (size_t)s->S;
    }
}

void fwd_bind(fwd *f, const attn_ws *ws) {
    float *proj = ws->proj;
    in_parts(f, proj, f->in);
    f->at.q = proj;
    f->at.ldq = f->b->key ? (size_t)f->QW : (size_t)f->W;
    f->ldkv = f->b->key ? 2 * (size_t)f->KW : (size_t)f->W;
    f->k = f->b->key ? proj + f->T * f->QW : proj + f->QW;
    f->v = f->k + f->KW;
    f->seqs = ws->seqs;
    f->freqs = ws->freqs;
    f->kv16 = ws->kv16;
    f->tasks = ws->tasks;
    place(f);
    if (f->m->hp.rope.dim) attn_rope_freqs(&f->m->hp.rope, f->freqs);
    f->at.seqs = f->seqs;
    f->at.tile = ws->tile;
    attn_attend_tasks(&f->at, f->b, f->tasks, NULL);
    f->sel = f->at;
    f->sel.tasks = f->tasks;
    f->at.tasks = f->tasks + f->nselect;
    proj_job_init(&f->in_job, f->in, PROJ_PARTS, 0, f->nthreads, ws->a16);
    // heads (T,H*D) @ Wo^T (H*D,E) + bo -> out (T,E)
    f->out = proj_part_of(f->proj, f->m, 3, f->b->out, (size_t)f->m->hp.embed_dim, f->at.q,
                          f->at.ldq, f->T);
    proj_job_init(&f->out_job, &f->out, 1, out_by_rows(f->b, f->nthreads), f->nthreads, ws->a16);
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

/* Rows [t * FWD_PREP_ROWS, +FWD_PREP_ROWS) of the batch through prepare_row. */
static void prepare_task(void *arg, int t, int tid) {
    (void)tid;
    const fwd *f = arg;
    size_t r0 = (size_t)t * FWD_PREP_ROWS;
    size_t r1 = r0 + FWD_PREP_ROWS < f->T ? r0 + FWD_PREP_ROWS : f->T;
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
    attn_bf16 *page = a->kv16 + p * attn_kv_page_elems(f->at.G, f->at.D);
    attn_kv_bf16_pack(page, f->at.G, f->at.D, n, a->k + j0 * a->ldkv, a->ldkv, a->v + j0 * a->ldkv,
                      a->ldkv);
}

/* Appends a loop of n tasks; one of none is left out. */
static int add(fwd_loop *loops, int n, attn_loop_kind kind, size_t ntasks, attn_task_fn run,
               void *arg) {
    if (ntasks) loops[n++] = (fwd_loop){kind, (int)ntasks, run, arg};
    return n;
}

int fwd_loops(fwd *f, fwd_loop *l) {
    size_t prep = f->prep ? (f->T + FWD_PREP_ROWS - 1) / FWD_PREP_ROWS : 0;
    int n = 0;
    n = add(l, n, ATTN_LOOP_ROUND, proj_prepare_tasks(&f->in_job), proj_prepare_task, &f->in_job);
    n = add(l, n, ATTN_LOOP_PROJ, proj_tile_tasks(&f->in_job), proj_tile_task, &f->in_job);
    n = add(l, n, ATTN_LOOP_PREP, prep, prepare_task, f);
    n = add(l, n, ATTN_LOOP_PACK, f->pages, pack_task, f);
    n = add(l, n, ATTN_LOOP_SELECT, f->nselect, attn_attend_task, &f->sel);
    n = add(l, n, ATTN_LOOP_ATTEND, f->ntasks - f->nselect, attn_attend_task, &f->at);
    n = add(l, n, ATTN_LOOP_OUT_ROUND, proj_prepare_tasks(&f->out_job), proj_prepare_task,
            &f->out_job);
    n = add(l, n, ATTN_LOOP_OUT, proj_tile_tasks(&f->out_job), proj_tile_task, &f->out_job);
    return n;
}

size_t attn_workspace_bytes(const attn_model *m, const attn_batch *b, int nthreads) {
    size_t T, U;
    fwd_tokens(b, &T, &U);
    fwd f;
    fwd_plan(&f, m, b, T, U, nthreads);
    return attn_ws_bytes(&f.need, nthreads);
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
    fwd_plan(&f, m, b, T, U, attn_ctx_threads(ctx));
    if (attn_ctx_reserve(ctx, &f.need, &ws) < 0) {
        snprintf(err, errlen, "out of memory for a batch of %zu query and %zu key tokens", T, U);
        return -1;
    }
    fwd_bind(&f, &ws);
    fwd_loop loops[FWD_LOOPS];
    int n = fwd_loops(&f, loops);
    attn_ctx_loops_clear(ctx);
    for (int i = 0; i < n; i++)
        attn_ctx_run_loop(ctx, loops[i].kind, loops[i].ntasks, loops[i].run, loops[i].arg);
    return 0;
}
