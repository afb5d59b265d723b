/* select.c - the attention weights a sequence selects (attn_select, attn.h):
 * some heads (in the order given, or their mean), a range of query rows,
 * and whole rows or each row's k largest weights. The sequence's output
 * goes through the no-matrix tasks; these tasks give its weights, and run
 * before those overwrite the queries with head outputs (forward.c).
 *
 * A task is (sequence, block of query rows) on the grid of the model's
 * weights rows (ops.h: weight_rows), for each block that holds selected
 * rows. For each key/value head that a selected head reads, it asks the
 * model's row for the weights of the selected rows (computed as the whole
 * block would be, so they are the whole matrix's bits), and delivers the
 * selected heads' rows. A mean sums the selected heads in ascending order,
 * as the full path sums them all.
 *
 * Cost: the selected heads' scores over the blocks that hold the selected
 * rows, and per thread one block's; never an (L,S) matrix per head. Top-k
 * is a partial selection: a heap of the k best (weight, key) pairs per row,
 * O(S log k), then those k in order; equal weights rank the lower key first.
 * Legend: see attn.h.
 */
#include <string.h>

#include "../ops/ops.h"
#include "../ops/seq.h"
#include "select.h"

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

/* Query rows of a task of s: the grid of the model's weights. */
static int block_rows(const attn_attend *a, const attn_seq *s) {
    return a->ops->weight_rows(a, s->S);
}

/* Rows of a mean a task keeps before its top-k (0: none kept). */
static int mean_rows(const attn_attend *a, const attn_seq *s) {
    return s->weights == ATTN_WEIGHTS_MEAN && s->sel.top_k ? block_rows(a, s) : 0;
}

/* Floats of weights a task holds at once. */
static size_t score_floats(const attn_attend *a, const attn_seq *s) {
    return a->ops->weight_floats(a, block_rows(a, s), s->S);
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

/* ---- tasks ---- */

/* The selected rows [r0, r1) of block [i0, i1): for each key/value head a
 * selected head reads, the weights of its R heads at those rows. */
void attn_select_task(const attn_attend *a, const attn_task *tk, float *scratch) {
    const attn_seq_at *sa = &a->seqs[tk->seq];
    const attn_seq *s = &sa->view;
    picks p = picks_of(a, s, scratch);
    int r0 = tk->i0 > p.row0 ? tk->i0 : p.row0, r1 = tk->i1 < p.row1 ? tk->i1 : p.row1;
    int R = a->H / a->G, S = s->S, first = 1;
    for (int g = 0; g < a->G; g++) {
        int any = 0;
        for (int m = 0; m < R; m++)
            any |= p.slot[g * R + m] >= 0;
        if (!any) continue;
        const float *x =
            a->ops->weights(a, sa, g, tk->i0, tk->i1, r0, r1, p.P); /* ((r1-r0)*R, S) */
        for (int m = 0; m < R; m++) { /* heads ascending: a mean sums as the full path does */
            int slot = p.slot[g * R + m];
            if (slot < 0) continue;
            for (int i = r0; i < r1; i++) {
                const float *w = x + ((size_t)(i - r0) * R + (size_t)m) * S;
                if (!p.mean)
                    put_row(&p, slot, i, w);
                else if (s->sel.top_k)
                    attn_mean_add(p.acc + (size_t)(i - r0) * S, w, (size_t)S, p.inv, first);
                else
                    attn_mean_add(s->attn + answer_at(&p, 0, i), w, (size_t)S, p.inv, first);
            }
            first = 0;
        }
    }
    for (int i = r0; p.mean && s->sel.top_k && i < r1; i++)
        put_row(&p, 0, i, p.acc + (size_t)(i - r0) * S);
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
