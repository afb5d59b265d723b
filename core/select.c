/* select.c - the attention weights a sequence selects (attn_select, attn.h):
 * some heads (in the order given, or their mean), a range of query rows,
 * and whole rows or each row's k largest weights. The sequence's output
 * goes through the no-weights path (attend.c: the fused block or the
 * tiles); these tasks give its weights, and run before that path
 * overwrites the queries with head outputs (attn.c).
 *
 * A task is (sequence, block of query rows), on the full path's grid of
 * blocks (attn_full_rows), for each block that holds selected rows. For
 * each selected head it computes the scores of the whole block, so that
 * every OpenBLAS call is the one the full path makes (OpenBLAS's bits
 * depend on the rows a call takes), then masks, normalises and delivers
 * the selected rows alone: the weights are the full path's bits. A mean
 * sums the selected heads in ascending order, as the full path sums them
 * all. Decoder models (rows_alone) take one row's R heads per call, as the
 * full path does, for each key/value head a selected head reads.
 *
 * A model that attends in bf16 (attn16) has its selected rows' weights
 * from attend_bf16.c's formula on its bf16 pages (attn_attend16_weights),
 * whose row bits never depend on the rows beside them: only the selected
 * rows are scored, on a grid of that path's blocks, and they are the bits
 * of the same model's whole matrix.
 *
 * Cost: the selected heads' scores over the blocks that hold the selected
 * rows (a block is at most 128 rows), and per thread one block's scores;
 * never an (L,S) matrix per head. Top-k is a partial selection: a heap of
 * the k best (weight, key) pairs per row, O(S log k), then those k in
 * order; equal weights rank the lower key index first.
 * Legend: see attn.h.
 */
#include <string.h>

#include "internal.h"

/* ---- top-k ---- */

/* A weight and its key. */
typedef struct {
    float v;
    int32_t j;
} ranked;

/* 1 when a ranks below b: a smaller weight, or the same at a later key. */
static int below(ranked a, ranked b) {
    return a.v < b.v || (a.v == b.v && a.j > b.j);
}

/* h (n) is a heap whose root ranks lowest; the item at i moves down. */
static void sift_down(ranked *h, int n, int i) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && below(h[c + 1], h[c])) c++;
        if (!below(h[c], h[i])) return;
        ranked t = h[c];
        h[c] = h[i];
        h[i] = t;
        i = c;
    }
}

/* The item at i of the heap h moves up. */
static void sift_up(ranked *h, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!below(h[i], h[p])) return;
        ranked t = h[p];
        h[p] = h[i];
        h[i] = t;
        i = p;
    }
}

/* val, idx (k) = the k largest weights of row (S), in descending order
 * (equal ones: the lower key first), and their keys; heap (k) is scratch. */
static void top_k(float *val, int32_t *idx, const float *row, int S, int k, ranked *heap) {
    int n = 0;
    for (int j = 0; j < S; j++) {
        if (n < k) {
            heap[n] = (ranked){row[j], j};
            sift_up(heap, n++);
        } else if (row[j] > heap[0].v) { /* an equal weight at a later key ranks below */
            heap[0] = (ranked){row[j], j};
            sift_down(heap, n, 0);
        }
    }
    for (int m = k - 1; m >= 0; m--) { /* the lowest first, into the last place */
        val[m] = heap[0].v;
        idx[m] = heap[0].j;
        heap[0] = heap[--n];
        sift_down(heap, n, 0);
    }
}

/* ---- where the weights go ---- */

/* One task's view of its sequence's selection, and its scratch. */
typedef struct {
    const attn_seq *s;
    int row0, row1; /* the selected rows */
    int nh;         /* selected heads */
    int W;          /* floats per answer row: top_k, or S */
    int mean;       /* 1: one mean over the selected heads */
    float inv;      /* 1 / nh */
    float *P;       /* (prow, S) scores, then weights */
    float *acc;     /* (prow or 1, S) a mean's rows before top-k */
    int *slot;      /* (H) each head's place among the selected, or -1 */
    ranked *heap;   /* (top_k) */
} picks;

/* Query rows of a task of s: the full path's block, or for bf16 the rows
 * attend_bf16.c's weights take at once. */
static int block_rows(const attn_attend *a, const attn_seq *s) {
    return a->bf16 ? attn_attend16_weight_rows(a, s->S) : attn_full_rows(s->S);
}

/* Floats of scores a task of s holds at once: a block's, one row's R
 * heads', or (bf16) the scratch of attend_bf16.c's weights of a block. */
static size_t score_floats(const attn_attend *a, const attn_seq *s) {
    if (a->bf16) return attn_attend16_weight_floats(a, block_rows(a, s), s->S);
    return (size_t)(a->rows_alone ? a->H / a->G : block_rows(a, s)) * s->S;
}

/* Rows of a mean a task keeps before its top-k (0: none kept). */
static int mean_rows(const attn_attend *a, const attn_seq *s) {
    if (s->weights != ATTN_WEIGHTS_MEAN || !s->sel.top_k) return 0;
    return a->rows_alone && !a->bf16 ? 1 : block_rows(a, s);
}

size_t attn_select_floats_of(const attn_attend *a, const attn_seq *s) {
    return score_floats(a, s) + (size_t)mean_rows(a, s) * s->S + (size_t)a->H +
           2 * (size_t)s->sel.top_k;
}

/* The selection of s laid out in scratch (attn_select_floats_of floats). */
static picks picks_of(const attn_attend *a, const attn_seq *s, float *scratch) {
    picks p = {.s = s, .mean = s->weights == ATTN_WEIGHTS_MEAN};
    attn_select_span(s, a->H, &p.row0, &p.row1, &p.nh);
    p.W = s->sel.top_k ? s->sel.top_k : s->S;
    p.inv = 1.0f / (float)p.nh;
    p.P = scratch;
    p.acc = p.P + score_floats(a, s);
    p.slot = (int *)(p.acc + (size_t)mean_rows(a, s) * s->S);
    p.heap = (ranked *)(p.slot + a->H);
    for (int h = 0; h < a->H; h++)
        p.slot[h] = s->sel.heads ? -1 : h;
    for (int c = 0; s->sel.heads && c < p.nh; c++)
        p.slot[s->sel.heads[c]] = c;
    return p;
}

/* Offset in attn (and attn_idx) of the answer row of head place `slot`
 * (0 for a mean) at query row i. */
static size_t answer_at(const picks *p, int slot, int i) {
    return ((size_t)slot * (size_t)(p->row1 - p->row0) + (size_t)(i - p->row0)) * (size_t)p->W;
}

/* The weights (S) of head place `slot` at query row i into the answer. */
static void put_row(const picks *p, int slot, int i, const float *w) {
    const attn_seq *s = p->s;
    size_t at = answer_at(p, slot, i);
    if (s->sel.top_k)
        top_k(s->attn + at, s->attn_idx + at, w, s->S, s->sel.top_k, p->heap);
    else
        memcpy(s->attn + at, w, sizeof(float) * (size_t)s->S);
}

/* The weights w (n rows of S) of one head at query rows i.., into the
 * answer (slot) or the mean (first: the first head of the mean). */
static void deliver(const picks *p, int slot, int i, const float *w, int n, int first) {
    const attn_seq *s = p->s;
    if (!p->mean) {
        for (int r = 0; r < n; r++)
            put_row(p, slot, i + r, w + (size_t)r * s->S);
        return;
    }
    float *mean = s->sel.top_k ? p->acc : s->attn + answer_at(p, 0, i);
    attn_mean_add(mean, w, (size_t)n * s->S, p->inv, first);
}

/* ---- tasks ---- */

/* The selected rows [r0, r1) of block [i0, i1), one head at a time (G == H). */
static void select_block(const attn_attend *a, const attn_seq_at *sa, picks *p, int i0, int i1,
                         int r0, int r1) {
    const attn_seq *s = &sa->view;
    int S = s->S, m0 = r0 - i0, first = 1;
    for (int h = 0; h < a->H; h++) { /* ascending: a mean sums as the full path does */
        if (p->slot[h] < 0) continue;
        attn_qrows r = attn_rows_of(a, sa, h, i0, i1);
        attn_qk(a, &r, p->P, S); /* the whole block: the full path's call */
        attn_weigh(&r, s, p->P, S, m0, m0 + r1 - r0);
        deliver(p, p->slot[h], r0, p->P + (size_t)m0 * S, r1 - r0, first);
        first = 0;
    }
    for (int i = r0; p->mean && s->sel.top_k && i < r1; i++)
        put_row(p, 0, i, p->acc + (size_t)(i - r0) * S);
}

/* The selected rows [r0, r1), one row's R heads at a time (decoder models). */
static void select_alone(const attn_attend *a, const attn_seq_at *sa, picks *p, int r0, int r1) {
    const attn_seq *s = &sa->view;
    int R = a->H / a->G;
    for (int i = r0; i < r1; i++) {
        int first = 1;
        for (int g = 0; g < a->G; g++) {
            int any = 0;
            for (int m = 0; m < R; m++)
                any |= p->slot[g * R + m] >= 0;
            if (!any) continue;
            attn_qrows r = attn_rows_of(a, sa, g, i, i + 1);
            attn_qk(a, &r, p->P, s->S); /* (R,S) */
            for (int m = 0; m < R; m++) {
                if (p->slot[g * R + m] < 0) continue;
                attn_weigh(&r, s, p->P, s->S, m, m + 1);
                deliver(p, p->slot[g * R + m], i, p->P + (size_t)m * s->S, 1, first);
                first = 0;
            }
        }
        if (p->mean && s->sel.top_k) put_row(p, 0, i, p->acc);
    }
}

/* The selected rows [r0, r1) of a model that attends in bf16: for each
 * key/value head a selected head reads, its R heads' weights of those rows
 * alone by attend_bf16.c's formula, the bits of its full matrix (a row's
 * bits never depend on the rows computed beside it). */
static void select_bf16(const attn_attend *a, const attn_seq_at *sa, picks *p, int r0, int r1) {
    const attn_seq *s = &sa->view;
    int R = a->H / a->G, S = s->S, first = 1;
    for (int g = 0; g < a->G; g++) {
        int any = 0;
        for (int m = 0; m < R; m++)
            any |= p->slot[g * R + m] >= 0;
        if (!any) continue;
        const float *x = attn_attend16_weights(a, sa, g, r0, r1, p->P); /* ((r1-r0)*R, S) */
        for (int m = 0; m < R; m++) { /* heads ascending: a mean sums as the full path does */
            int slot = p->slot[g * R + m];
            if (slot < 0) continue;
            for (int i = r0; i < r1; i++) {
                const float *w = x + ((size_t)(i - r0) * R + (size_t)m) * S;
                if (!p->mean)
                    put_row(p, slot, i, w);
                else if (s->sel.top_k)
                    attn_mean_add(p->acc + (size_t)(i - r0) * S, w, (size_t)S, p->inv, first);
                else
                    attn_mean_add(s->attn + answer_at(p, 0, i), w, (size_t)S, p->inv, first);
            }
            first = 0;
        }
    }
    for (int i = r0; p->mean && s->sel.top_k && i < r1; i++)
        put_row(p, 0, i, p->acc + (size_t)(i - r0) * S);
}

void attn_select_task(const attn_attend *a, const attn_task *tk, float *scratch) {
    const attn_seq_at *sa = &a->seqs[tk->seq];
    picks p = picks_of(a, &sa->view, scratch);
    int r0 = tk->i0 > p.row0 ? tk->i0 : p.row0, r1 = tk->i1 < p.row1 ? tk->i1 : p.row1;
    if (a->bf16)
        select_bf16(a, sa, &p, r0, r1);
    else if (a->rows_alone)
        select_alone(a, sa, &p, r0, r1);
    else
        select_block(a, sa, &p, tk->i0, tk->i1, r0, r1);
}

size_t attn_select_tasks(const attn_attend *a, const attn_seq *s, int i, attn_task *tasks,
                         size_t n) {
    int row0, row1, nh, rows = block_rows(a, s);
    attn_select_span(s, a->H, &row0, &row1, &nh);
    for (int b0 = row0 / rows * rows; b0 < row1; b0 += rows, n++)
        if (tasks)
            tasks[n] = (attn_task){i, ATTN_TASK_SELECT, b0, b0 + rows < s->L ? b0 + rows : s->L};
    return n;
}
