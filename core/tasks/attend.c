/* attend.c - the attention tasks of a forward: which tasks a batch is cut
 * into, and running each on the model's attention row (ops.h). A task is
 * (sequence, key/value head g, row block) for the R = H/G query heads that
 * read g when no matrix is asked for; (sequence, row block) for every head
 * when a whole matrix is; or (sequence, row block) of the selected rows of
 * a selection (select.c), which run first since they read the queries that
 * the others overwrite with head outputs.
 *
 * Tasks are cut from each sequence alone, never from the batch or the
 * thread count, so a sequence's bits do not depend on what shares its batch
 * (docs/performance.md, batch invariance); except where the row's bits do
 * not depend on their block (the row's fewer_lanes): there no-matrix tasks take fewer rows
 * while the batch would leave threads without one. Later row blocks come
 * first: they cost more under causal. Nothing here computes attention, nor
 * projects, rotates or touches a cache.
 * Legend: see attn.h.
 */
#include <string.h>

#include "../ops/seq.h"
#include "../select/select.h"
#include "attend.h"

/* 1 when s's whole matrices come from its output tasks (the full path);
 * a sequence that selects a part gets its output as with no matrix. */
static int full_weights(const attn_attend *a, const attn_seq *s) {
    return s->weights != ATTN_WEIGHTS_NONE && !attn_seq_selects(s, a->H);
}

/* One (sequence, row block), every head: per key/value head, the weights
 * of the block's rows into the matrix the caller wants (heads, or their
 * mean: heads come in order, g outer, so a mean adds them in order), then
 * the rows' outputs. */
static void attend_full(const attn_attend *a, const attn_task *tk, float *scratch) {
    const attn_seq_at *sa = &a->seqs[tk->seq];
    const attn_seq *s = &sa->view;
    int R = a->H / a->G, L = s->L, S = s->S, rows = a->ops->weight_rows(a, S);
    size_t wfloats = (a->ops->weight_floats(a, rows, S) + 15) / 16 * 16;
    float invH = 1.0f / (float)a->H;
    for (int g = 0; g < a->G; g++) {
        const float *w = a->ops->weights(a, sa, g, tk->i0, tk->i1, tk->i0, tk->i1, scratch);
        for (int r = 0; r < (tk->i1 - tk->i0) * R; r++) {
            int i = tk->i0 + r / R, h = g * R + r % R;
            const float *row = w + (size_t)r * S;
            if (s->weights == ATTN_WEIGHTS_HEADS)
                memcpy(s->attn + ((size_t)h * L + i) * S, row, sizeof(float) * (size_t)S);
            else
                attn_mean_add(s->attn + (size_t)i * S, row, (size_t)S, invH, h == 0);
        }
        a->ops->outputs(a, sa, g, tk->i0, tk->i1, w, scratch + wfloats);
    }
}

void attn_attend_task(void *arg, int t, int tid) {
    const attn_attend *a = arg;
    const attn_task *tk = &a->tasks[t];
    float *scratch = a->tile[tid];
    if (tk->head == ATTN_TASK_SELECT)
        attn_select_task(a, tk, scratch);
    else if (tk->head == ATTN_TASK_FULL)
        attend_full(a, tk, scratch);
    else
        a->ops->block(a, &a->seqs[tk->seq], tk->head, tk->i0, tk->i1, scratch);
}

/* Query rows a no-matrix task of `lanes` lanes takes. */
static int rows_of_lanes(const attn_attend *a, int lanes) {
    int rows = lanes / (a->H / a->G);
    return rows < 1 ? 1 : rows;
}

/* Query rows per task of sequence s. */
static int task_rows(const attn_attend *a, const attn_seq *s) {
    if (full_weights(a, s)) return a->ops->weight_rows(a, s->S);
    return a->cut_rows;
}

void attn_attend_cut(attn_attend *a, const attn_batch *b, int nthreads) {
    int R = a->H / a->G, lanes = a->ops->block_lanes(a);
    size_t want = (size_t)nthreads; /* a task each: smaller blocks run slower */
    a->cut_rows = rows_of_lanes(a, lanes);
    while (attn_attend_tasks(a, b, NULL, NULL) < want &&
           (lanes = a->ops->fewer_lanes(a, lanes)) >= R)
        a->cut_rows = lanes / R;
}

size_t attn_attend_floats(const attn_attend *a, const attn_seq *s) {
    size_t sel = attn_seq_selects(s, a->H) ? attn_select_floats_of(a, s) : 0, n;
    if (full_weights(a, s))
        n = a->ops->full_floats(a, a->ops->weight_rows(a, s->S), s->S);
    else
        n = a->ops->block_floats(a);
    return n > sel ? n : sel;
}

/* One sequence's output tasks, from tasks[n]; returns the next n. */
static size_t output_tasks(const attn_attend *a, const attn_seq *s, int i, attn_task *tasks,
                           size_t n) {
    int rows = task_rows(a, s), blocks = (s->L + rows - 1) / rows;
    int full = full_weights(a, s); /* else a task per key/value head */
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
