/* attend.c - the attention tasks of a forward: for a block of query rows of
 * one sequence, QK^T, the masks, softmax and AV, on projected (and rotated)
 * queries, keys and values; each task's head outputs overwrite its own
 * (already used) query columns. A task is (sequence, key/value head g, row
 * block) and covers the R = H/G query heads that read g (one head when
 * G == H), or (sequence, row block) for every head when an attention matrix
 * is asked for. Three ways to run one:
 *
 *   fused     no matrix asked for, AVX-512 and D a multiple of 16 up to 128:
 *             fused.c's online-softmax block, the R heads of a row side by
 *             side in its lanes;
 *   tiles     no matrix asked for, elsewhere: keys in tiles of KB with an
 *             online softmax (softmax.c), QK^T and AV by OpenBLAS, so no
 *             (L,S) matrix is ever held;
 *   full      a matrix asked for: whole rows of scores, written where the
 *             caller wants the weights (or summed into their mean).
 *
 * A sequence that asks for a part of its matrices (attn_select: some heads,
 * some rows, top-k) gets its output as with no matrix, and its weights from
 * select.c's tasks, which run first (they read the queries these tasks
 * overwrite).
 *
 * An OpenBLAS call takes M query rows at one stride: for nn.MultiheadAttention
 * a block of up to QB rows of one head, as attnd has always computed it; for
 * decoder models the R heads of one row, so that a row's bits never depend
 * on the block it is in (OpenBLAS's do, on the number of rows of a call):
 * a session step's rows are then the bits of the whole sequence's.
 * Tasks on OpenBLAS are cut from each sequence alone, never from the batch
 * or the thread count (docs/performance.md, batch invariance). Fused tasks
 * take up to ATTN_FUSED_ROWS lanes (rows x the R heads of a row), fewer
 * when the batch would leave threads without a task (attn_attend_cut): a
 * row's bits do not depend on its block there (fused.c), and at 64 threads
 * a lone (1,128,512,8) request's 8 tasks of 128 rows left 56 threads idle
 * (bench/bench_scale.c). Not down to three per thread as projection tiles
 * are: smaller blocks run slower, and where the tasks are already one per
 * thread the cut cost more than it balanced. It does not
 * project, rotate or touch a cache (attn.c does, before). A model that
 * attends in bf16 (attn_model.attn16) has its tasks run by attend_bf16.c.
 * Legend: see attn.h.
 */
#include <math.h>
#include <string.h>

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
    FUSED_BLOCK = 64,      /* lanes (rows x heads) fused.c computes together */
    FUSED_VECTOR = 16,     /* lanes of one vector: the fewest a fused task is cut to */
};

attn_qrows attn_rows_of(const attn_attend *a, const attn_seq_at *sa, int g, int i0, int i1) {
    int R = a->H / a->G, D = a->D, alone = a->rows_alone;
    attn_qrows r = {.q = a->q + (sa->q0 + (size_t)i0) * a->ldq + (size_t)g * R * D,
                    .ldq = alone ? (size_t)D : a->ldq,
                    .M = alone ? R : i1 - i0,
                    .pos = i0 + sa->shift,
                    .dpos = !alone,
                    .k = sa->k + (size_t)g * D,
                    .v = sa->v + (size_t)g * D,
                    .ldkv = sa->ldkv,
                    .jend = sa->view.S};
    if (sa->view.causal && r.jend > i1 + sa->shift)
        r.jend = i1 + sa->shift; /* later keys are hidden from every row */
    return r;
}

/* Hides masked scores of rows r x keys [j0, j0+Sb) (sc at stride ldsc):
 * -inf where hidden, the additive mask added elsewhere. Masks index rows by
 * position: a cache step has none. */
static void mask_scores(float *sc, int ldsc, const attn_seq *s, const attn_qrows *r, int j0,
                        int Sb) {
    int causal = s->causal && j0 + Sb - 1 > r->pos;
    if (!causal && !s->key_padding_mask && !s->attn_mask_bool && !s->attn_mask_add) return;
    for (int m = 0; m < r->M; m++) {
        int i = r->pos + m * r->dpos;
        float *row = sc + (size_t)m * ldsc;
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

/* Scratch rows of an OpenBLAS tile: QB, or R when a row's heads are more. */
static int tile_rows(const attn_attend *a) {
    int R = a->H / a->G;
    return a->rows_alone && R > QB ? R : QB;
}

/* The rows r over key tiles with an online softmax: never more than an
 * (M, KB) block of scores. */
static void tiles(const attn_attend *a, const attn_qrows *r, const attn_seq *s, float *scratch) {
    int M = r->M, D = a->D, cap = tile_rows(a);
    float *sc = scratch;                /* (M,KB) scores, then probabilities */
    float *acc = sc + (size_t)cap * KB; /* (M,D) unnormalised output */
    float *mx = acc + (size_t)cap * D;  /* (M) running row max */
    float *sum = mx + cap;              /* (M) running row sum */
    memset(acc, 0, sizeof(float) * (size_t)M * D);
    for (int m = 0; m < M; m++) {
        mx[m] = -INFINITY;
        sum[m] = 0.0f;
    }
    for (int j0 = 0; j0 < r->jend; j0 += KB) {
        int Sb = r->jend - j0 < KB ? r->jend - j0 : KB;
        // q (M,D) @ k^T (D,Sb) * scale -> sc (M,Sb)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, Sb, D, a->scale, r->q, (int)r->ldq,
                   r->k + (size_t)j0 * r->ldkv, (int)r->ldkv, 0.0f, sc, Sb);
        mask_scores(sc, Sb, s, r, j0, Sb);
        attn_softmax_online(sc, Sb, M, Sb, mx, sum, acc, D);
        // p (M,Sb) @ v (Sb,D) + acc -> acc (M,D)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, Sb, 1.0f, sc, Sb,
                   r->v + (size_t)j0 * r->ldkv, (int)r->ldkv, 1.0f, acc, D);
    }
    for (int m = 0; m < M; m++) {
        float inv = sum[m] > 0 ? 1.0f / sum[m] : 0.0f; /* all keys hidden: 0 */
        for (int d = 0; d < D; d++)
            r->q[(size_t)m * r->ldq + d] = acc[(size_t)m * D + d] * inv;
    }
}

void attn_qk(const attn_attend *a, const attn_qrows *r, float *P, int ldP) {
    // q (M,D) @ k^T (D,jend) * scale -> P (M,jend)
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->M, r->jend, a->D, a->scale, r->q,
               (int)r->ldq, r->k, (int)r->ldkv, 0.0f, P, ldP);
}

void attn_weigh(const attn_qrows *r, const attn_seq *s, float *P, int ldP, int m0, int m1) {
    attn_qrows part = *r; /* rows m0..m1 of r */
    part.q += (size_t)m0 * r->ldq;
    part.M = m1 - m0;
    part.pos += m0 * r->dpos;
    float *rows = P + (size_t)m0 * ldP;
    mask_scores(rows, ldP, s, &part, 0, r->jend);
    attn_softmax_rows(rows, (size_t)ldP, m1 - m0, r->jend, s->S);
}

/* The rows r with whole rows of scores P (M, S) at stride ldP: P ends as the
 * rows' attention weights (zeros past jend), q as their outputs. */
static void full(const attn_attend *a, const attn_qrows *r, const attn_seq *s, float *P, int ldP) {
    attn_qk(a, r, P, ldP);
    attn_weigh(r, s, P, ldP, 0, r->M);
    // P (M,jend) @ v (jend,D) -> q's own rows (M,D): q is used up
    blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r->M, a->D, r->jend, 1.0f, P, ldP, r->v,
               (int)r->ldkv, 0.0f, r->q, (int)r->ldq);
}

void attn_mean_add(float *mean, const float *P, size_t n, float inv, int first) {
    for (size_t e = 0; e < n; e++)
        mean[e] = first ? P[e] * inv : mean[e] + P[e] * inv;
}

int attn_full_rows(int S) {
    int r = FULL_FLOATS / S;
    if (r > QB) r = QB;
    if (r < 8) r = 8;
    return r;
}

/* One (sequence, row block), every head, with whole rows of scores. */
static void attend_full(const attn_attend *a, const attn_task *tk, float *scratch) {
    const attn_seq_at *sa = &a->seqs[tk->seq];
    const attn_seq *s = &sa->view;
    int H = a->H, R = H / a->G, L = s->L, S = s->S, i0 = tk->i0, Lb = tk->i1 - tk->i0;
    float invH = 1.0f / (float)H;
    int heads = s->weights == ATTN_WEIGHTS_HEADS, mean = s->weights == ATTN_WEIGHTS_MEAN;
    if (!a->rows_alone) { /* a block of rows per head (G == H) */
        for (int h = 0; h < H; h++) {
            attn_qrows r = attn_rows_of(a, sa, h, i0, tk->i1);
            float *P = heads ? s->attn + ((size_t)h * L + i0) * S : scratch; /* (Lb,S) */
            full(a, &r, s, P, S);
            if (mean) attn_mean_add(s->attn + (size_t)i0 * S, P, (size_t)Lb * S, invH, h == 0);
        }
        return;
    }
    for (int g = 0; g < a->G; g++) /* the R heads of one row at a time */
        for (int i = i0; i < tk->i1; i++) {
            attn_qrows r = attn_rows_of(a, sa, g, i, i + 1);
            full(a, &r, s, scratch, S); /* (R,S) */
            for (int m = 0; m < R; m++) {
                int h = g * R + m;
                const float *P = scratch + (size_t)m * S;
                if (heads) memcpy(s->attn + ((size_t)h * L + i) * S, P, sizeof(float) * S);
                if (mean) attn_mean_add(s->attn + (size_t)i * S, P, (size_t)S, invH, h == 0);
            }
        }
}

/* One (sequence, key/value head, row block) with no matrix asked for. */
static void attend_tiled(const attn_attend *a, const attn_task *tk, float *scratch) {
    const attn_seq_at *sa = &a->seqs[tk->seq];
    int g = tk->head, i0 = tk->i0, rows = tk->i1 - tk->i0;
    if (a->fused) {
        float *q = a->q + (sa->q0 + (size_t)i0) * a->ldq + (size_t)g * (a->H / a->G) * a->D;
        attn_fused_block(q, a->ldq, a->H / a->G, sa->k + (size_t)g * a->D, sa->v + (size_t)g * a->D,
                         sa->ldkv, &sa->view, i0 + sa->shift, rows, a->D, a->scale, scratch);
        return;
    }
    if (!a->rows_alone) {
        attn_qrows r = attn_rows_of(a, sa, g, i0, tk->i1);
        tiles(a, &r, &sa->view, scratch);
        return;
    }
    for (int i = i0; i < tk->i1; i++) {
        attn_qrows r = attn_rows_of(a, sa, g, i, i + 1);
        tiles(a, &r, &sa->view, scratch);
    }
}

void attn_attend_task(void *arg, int t, int tid) {
    const attn_attend *a = arg;
    const attn_task *tk = &a->tasks[t];
    if (tk->head == ATTN_TASK_SELECT)
        attn_select_task(a, tk, a->tile[tid]);
    else if (a->bf16)
        attn_attend16_task(a, tk, a->tile[tid]);
    else if (tk->head >= 0)
        attend_tiled(a, tk, a->tile[tid]);
    else
        attend_full(a, tk, a->tile[tid]);
}

int attn_full_weights(const attn_attend *a, const attn_seq *s) {
    return s->weights != ATTN_WEIGHTS_NONE && !attn_seq_selects(s, a->H);
}

/* Query rows per task of sequence s. */
static int task_rows(const attn_attend *a, const attn_seq *s) {
    if (a->bf16) return attn_attend16_rows(a, s);
    if (attn_full_weights(a, s)) return attn_full_rows(s->S);
    return a->fused ? a->fused_rows : QB;
}

/* Lanes of the next smaller fused block: halved down to one block of
 * FUSED_BLOCK, then one vector (fused.c runs 17 to 63 lanes at the cost of
 * 64, and 16 or fewer alone); 0 past that. */
static int fewer_lanes(int lanes) {
    return lanes > FUSED_BLOCK ? lanes / 2 : lanes > FUSED_VECTOR ? FUSED_VECTOR : 0;
}

void attn_attend_cut(attn_attend *a, const attn_batch *b, int nthreads) {
    int R = a->H / a->G, lanes = ATTN_FUSED_ROWS;
    size_t want = (size_t)nthreads; /* a task each: smaller blocks run slower (fused.c) */
    a->fused_rows = lanes / R;
    if (!a->fused) return;
    while (attn_attend_tasks(a, b, NULL, NULL) < want && (lanes = fewer_lanes(lanes)) >= R)
        a->fused_rows = lanes / R;
}

size_t attn_attend_floats(const attn_attend *a, const attn_seq *s) {
    int R = a->H / a->G;
    size_t n, sel = attn_seq_selects(s, a->H) ? attn_select_floats_of(a, s) : 0;
    if (a->bf16)
        n = attn_attend16_floats(a, s);
    else if (attn_full_weights(a, s))
        return (size_t)(a->rows_alone ? R : attn_full_rows(s->S)) * s->S;
    else
        n = a->fused ? attn_fused_floats(a->D) : (size_t)tile_rows(a) * (KB + (size_t)a->D + 2);
    return n > sel ? n : sel;
}

/* One sequence's output tasks, from tasks[n]; returns the next n. Later
 * row blocks first: they cost more under causal. */
static size_t output_tasks(const attn_attend *a, const attn_seq *s, int i, attn_task *tasks,
                           size_t n) {
    int rows = task_rows(a, s), blocks = (s->L + rows - 1) / rows;
    int full = attn_full_weights(a, s); /* else a task per key/value head */
    for (int blk = blocks - 1; blk >= 0; blk--) {
        int i0 = blk * rows, i1 = i0 + rows < s->L ? i0 + rows : s->L;
        for (int g = 0; g < (full ? 1 : a->G); g++, n++)
            if (tasks) tasks[n] = (attn_task){i, full ? ATTN_TASK_FULL : g, i0, i1};
    }
    return n;
}

size_t attn_attend_tasks(const attn_attend *a, const attn_batch *b, attn_task *tasks,
                         size_t *nselect) {
    size_t n = 0;
    for (int i = 0; i < b->B; i++)
        if (attn_seq_selects(&b->seqs[i], a->H)) n = attn_select_tasks(a, &b->seqs[i], i, tasks, n);
    if (nselect) *nselect = n;
    for (int i = 0; i < b->B; i++)
        n = output_tasks(a, &b->seqs[i], i, tasks, n);
    return n;
}
